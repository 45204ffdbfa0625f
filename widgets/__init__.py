"""rlinf-nb."""
