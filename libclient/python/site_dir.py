"""libclient/python/site_dir.py — run by libclient/meson.build at configure time with the
python3 that will import gradlane: prints the directory to install the package into, or
nothing if that interpreter imports from no directory under the prefix.

    python3 site_dir.py PREFIX MESON_PURELIB

meson's purelib when the interpreter imports from it; else the interpreter's first site
directory under PREFIX (Debian's python3 with prefix /usr/local: meson 1.0 says
/usr/local/lib/python3/dist-packages, the interpreter reads
/usr/local/lib/python3.X/dist-packages).
"""
import os
import site
import sys

prefix, meson_dir = (os.path.normpath(a) for a in sys.argv[1:3])
searched = [os.path.normpath(p) for p in sys.path if p]
if meson_dir in searched:
    print(meson_dir)
else:
    under = [p for p in site.getsitepackages()
             if os.path.normpath(p).startswith(prefix.rstrip("/") + "/")]
    print(under[0] if under else "")
