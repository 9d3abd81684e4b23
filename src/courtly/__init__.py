"""courtly: a polite, persistent web crawler."""

__version__ = "0.1.0"
