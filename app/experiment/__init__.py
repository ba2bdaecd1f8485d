"""`sieve experiment`: variants of the settings side by side on one store (docs/cli.md)."""
