import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")


def pytest_collection_modifyitems(config, items):
    """Files with multi-process tests (``slow``) first, the rest in their order: under
    ``make test``'s two workers, the long files start early and the quick ones fill the end."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)
