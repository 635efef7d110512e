"""`python -m volume_stream.cli`."""

from volume_stream.cli.app import main

main()
