from rlstream.cli import main

main()
