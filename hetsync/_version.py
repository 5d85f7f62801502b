"""hetsync's version, in one place: the package (``hetsync.__version__``), the ``hetsync --version`` command and
setup.py (which reads this file's text, without importing hetsync) all take it from here."""
__version__ = "0.1.0"
