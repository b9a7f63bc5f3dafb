"""The command-line entry points: thin, they parse flags and call the layers below."""
