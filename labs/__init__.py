"""The labs: ``labs/<lab>/lab.toml`` (exercise table) and ``labs/<lab>/checks`` (checks).

A ``labs/`` folder elsewhere on ``sys.path`` (e.g. the test suite's fixture labs) extends this
package, pkgutil-style.
"""
from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)
