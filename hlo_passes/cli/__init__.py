"""The `hlo-passes` command line: one module per subcommand, each exposing
`COMMAND` (its name), `HELP`, `add_arguments(parser)` and `main(args) -> int`."""
