"""parsim: simulate and execute distributed transformer training plans."""
__version__ = "0.1.0"
