"""`raytrain ...`: the command line, thin over the client, the service's deploy helpers and
the pure planners. `parser` parses and dispatches, `commands` talks to a service,
`service_commands` starts and stops one (serve, stop, demo), `flags` checks each flag's
value, `views` draws tables and `progress_view` the live bar; nothing outside this package
prints."""

from raytrain.cli.parser import build_parser, main

__all__ = ["build_parser", "main"]
