"""The source distribution holds what its own tests read: they run from an unpacked sdist."""
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Folders the tests read files from, besides the package and the tests themselves.
READ_BY_TESTS = ("examples", "benchmarks/results", "tests/reference_lsds", "tests/data")


def test_the_sdist_holds_the_files_the_tests_read(tmp_path):
    """examples/ and benchmarks/results/ were left out: four shipped tests failed from the unpacked sdist."""
    # a copy without build outputs: setuptools also ships what an earlier build's egg-info lists
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".*", "*.so", "*.egg-info", "__pycache__", "build",
                                                                "dist"))
    build = "import sys; from setuptools import build_meta as b; print(b.build_sdist(sys.argv[1]))"
    out = subprocess.run([sys.executable, "-c", build, str(tmp_path)], cwd=source, capture_output=True, text=True,
                         timeout=120, check=True)
    archive = tmp_path / out.stdout.strip().splitlines()[-1]
    with tarfile.open(archive) as tar:
        shipped = {Path(*Path(name).parts[1:]).as_posix() for name in tar.getnames()}
    wanted = {path.relative_to(ROOT).as_posix() for folder in READ_BY_TESTS for path in (ROOT / folder).rglob("*")
              if path.is_file() and "__pycache__" not in path.parts}
    wanted |= {path.relative_to(ROOT).as_posix() for path in (ROOT / "tests").glob("*.py")}
    assert wanted and not wanted - shipped, sorted(wanted - shipped)
