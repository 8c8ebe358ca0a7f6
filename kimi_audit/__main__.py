from kimi_audit.cli import main

main()
