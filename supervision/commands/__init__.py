"""The `harness` subcommands, one module per group; `supervision.cli` wires them up."""
