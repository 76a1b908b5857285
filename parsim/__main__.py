from parsim.cli import entry

entry()
