"""One module per CLI subcommand; see kvwatch.cli for the protocol they follow."""
