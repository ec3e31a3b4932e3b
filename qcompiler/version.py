"""The version of qcompiler (in its own module, so that any layer can read it)."""
__version__ = "0.1.0"
