"""The package as users install it: `python -m build` makes an sdist and a wheel; the wheel,
installed into a new venv, runs `llmframe-ray --version`, has its package data (py.typed, the
playground's files) and builds and searches a small index (scripts/check_wheel.py).

The new venv installs the wheel alone (--no-deps) and reads the dependencies from this
project's venv through a path file: the wheel's own contents are what is checked, without
downloading Ray and PyTorch again (the release workflow installs it with its dependencies)."""

from __future__ import annotations

import site
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_build_install_and_run_the_wheel(tmp_path):
    dist = tmp_path / "dist"
    built = subprocess.run([sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)], capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (wheel,) = dist.glob("llmframe_ray-*.whl")
    (sdist,) = dist.glob("llmframe_ray-*.tar.gz")
    names = zipfile.ZipFile(wheel).namelist()
    assert {"llmframe_ray/py.typed", "llmframe_ray/api/static/index.html", "llmframe_ray/api/static/app.js"} <= set(names)
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/"))]
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert "llmframe-ray = llmframe_ray.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
    with tarfile.open(sdist) as archive:
        assert any(n.endswith("/llmframe_ray/api/static/style.css") for n in archive.getnames())

    clean = tmp_path / "clean"
    venv.create(clean, with_pip=False)
    own_site = next((clean / "lib").glob("python3*/site-packages"))
    deps = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (own_site / "project-deps.pth").write_text("\n".join(deps) + "\n")  # a path file: the deps' .pth files are not run
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(own_site), str(wheel)],
                             capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr[-2000:]
    script = clean / "bin" / "llmframe-ray"  # what pip writes for that entry point (--target writes no scripts)
    script.write_text(f"#!{clean / 'bin' / 'python'}\nfrom llmframe_ray.cli import main\nmain()\n")
    script.chmod(0o755)
    checked = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_wheel.py"), "--cli", str(script)],
                             capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.splitlines()[0] == "llmframe-ray 0.1.0"
    assert f"installed at {own_site / 'llmframe_ray'}" in checked.stdout  # the wheel's copy, not this checkout
