"""The committed lock file pins, with hashes, every dependency pyproject.toml asks for, inside its range.

scripts/bootstrap installs the development and CI environment from scripts/requirements.lock
alone (``--no-deps``), so a dependency added to pyproject.toml but not locked would be
missing there, and a lock older than a tightened range would install what users cannot get.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$")


def _locked() -> dict[str, tuple[Version, int]]:
    """Each package locked for this Python and platform: its version and how many hashes it carries.

    The lock is universal: a package may be pinned once per environment marker (numpy for
    Python 3.11 and for 3.12+, say); the pins whose markers match this interpreter count.
    """
    pins: dict[str, tuple[Version, int]] = {}
    name = ""
    for line in (REPO / "scripts" / "requirements.lock").read_text().splitlines():
        match = _PIN.match(line)
        if match:
            name = canonicalize_name(match.group(1))
            if match.group(3) and not Marker(match.group(3)).evaluate():
                name = ""  # another environment's pin
                continue
            assert name not in pins, f"{name} is pinned twice for this environment"
            pins[name] = (Version(match.group(2)), 0)
        elif line.strip().startswith("--hash=sha256:") and name:
            version, hashes = pins[name]
            pins[name] = (version, hashes + 1)
    return pins


def _wanted() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    texts = [*project["project"]["dependencies"], *project["build-system"]["requires"]]
    for extra in ("test", "bench"):
        texts += project["project"]["optional-dependencies"][extra]
    return [Requirement(text) for text in texts]


def test_every_dependency_is_locked_with_hashes_inside_its_range() -> None:
    pins = _locked()
    assert pins, "scripts/requirements.lock pins nothing"
    for requirement in _wanted():
        if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} is not in scripts/requirements.lock (run scripts/lock)"
        version, hashes = pins[name]
        assert requirement.specifier.contains(version, prereleases=True), f"locked {name}=={version} is outside {requirement}"
        assert hashes > 0, f"{name} has no hash in scripts/requirements.lock"


def test_every_locked_package_has_a_hash() -> None:
    assert all(hashes > 0 for _version, hashes in _locked().values())
