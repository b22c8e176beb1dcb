"""dtrain's version, in one place (the package and the command line read it here)."""
__version__ = "0.1.0"
