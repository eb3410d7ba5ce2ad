"""Lets `python -c "import pagoda"` work from the root of a checkout without installing: the
package lives in python/pagoda; this file only points the import there (its submodules and
build/libpagoda.so are found from that directory)."""
import os as _os

__path__ = [_os.path.join(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))), "python", "pagoda")]
with open(_os.path.join(__path__[0], "__init__.py"), encoding="utf-8") as _f:
    exec(compile(_f.read(), _f.name, "exec"))
