from parsim.cli import entry

if __name__ == "__main__":      # not when multiprocessing re-imports the main module
    entry()
