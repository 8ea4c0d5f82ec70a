from gpulab.ssh.gateway import main

main()
