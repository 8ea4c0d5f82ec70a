from gpulab.ssh.cli import main

main()
