"""The tool's version, in a module of its own so that every part can name it without importing the
package's public API (and so without an import circle)."""
from __future__ import annotations

__version__ = "0.1.0"
