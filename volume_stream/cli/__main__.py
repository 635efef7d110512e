"""`python -m volume_stream.cli`."""

from volume_stream.cli import main

main()
