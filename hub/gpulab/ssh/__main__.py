from .gateway import main

main()
