# SPDX-License-Identifier: MIT
"""The repository's files, for the maintenance scripts and the docs check: what git tracks plus
what it does not ignore; when the root is not the top of a git checkout (the Debian build's
scratch copy of the tree) every file below it except build trees, the copied debian/ folder and
node_modules."""
import os
import subprocess


def _is_build_dir(path, name):
    return (name.startswith((".git", "build", "obj-")) or name == "node_modules"
            or os.path.exists(os.path.join(path, name, "meson-private")))


def repo_files(root):
    """Relative paths of the regular files of the tree at root, sorted."""
    try:
        # root must be the checkout's top: a copy of the tree inside another checkout (an
        # ignored scratch folder) would list nothing
        top = subprocess.run(["git", "-C", root, "rev-parse", "--show-toplevel"],
                             capture_output=True, text=True, check=True).stdout.strip()
        if not os.path.samefile(top, root):
            raise OSError("not the top of a git checkout")
        out = subprocess.run(["git", "-C", root, "ls-files", "-co", "--exclude-standard"],
                             capture_output=True, text=True, check=True).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        out = []
        for d, dirs, names in os.walk(root):
            top = os.path.samefile(d, root)
            dirs[:] = [x for x in dirs if not _is_build_dir(d, x) and not (top and x == "debian")]
            out += [os.path.relpath(os.path.join(d, x), root) for x in names]
    return sorted(f for f in out if f and os.path.isfile(os.path.join(root, f)))
