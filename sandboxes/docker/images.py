"""Sandbox images without a registry: the base image from a Debian minbase root file system,
and environment images built on top of it from a Dockerfile.

Nothing is pulled. The base image is made with ``debootstrap --variant=minbase
--include=python3 <suite>`` into a temporary directory, given an unprivileged user
``sandbox`` (uid/gid 1000, ``SANDBOX_UID``) and a ``/work`` directory it owns, packed as a
tar and ``docker import``-ed. An environment image is ``docker build`` of a Dockerfile whose
``FROM`` names a local image (the build runs with ``pull=False`` and no network).

Caching: every image we build carries the label ``agentrl.recipe`` (``RECIPE_LABEL``), a
SHA-256 of what went into it (for the base image: suite, mirror, package list and this
module's ``BASE_RECIPE_VERSION``; for a Dockerfile image: the Dockerfile, every file of the
build context, and the id of the image it starts ``FROM``). ``build_image`` returns at once
when an image of that name exists with the same recipe, and rebuilds only when the recipe
changed (or ``force``).

This module imports ``docker`` (it is part of the Docker backend).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from agentrl.errors import ConfigError, SandboxError
from sandboxes.docker.daemon import docker_client, infra_errors

logger = logging.getLogger(__name__)

BASE_IMAGE = "agentrl-base:latest"
"""Default ``SandboxSpec.image`` and the name ``build_image()`` gives the base image."""
RECIPE_LABEL = "agentrl.recipe"
BASE_RECIPE_VERSION = "1"
"""Bump when the base image's recipe below changes in a way its inputs do not show."""
DEFAULT_SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3",)
"""The full standard library (``python3-minimal`` lacks ``json``, ``unittest``, ``dataclasses``
..., which task code and test harnesses import)."""
SANDBOX_UID = 1000
"""uid and gid of the ``sandbox`` user in the base image (containers run as this user)."""

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._/-]{0,127}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?$")
Progress = Callable[[str], None]


def _say(progress: Progress | None, message: str) -> None:
    logger.info("%s", message)
    if progress is not None:
        progress(message)


def _client():
    import docker
    import docker.errors

    try:
        client = docker.from_env(timeout=600)
        client.ping()
    except docker.errors.DockerException as exc:
        raise SandboxError(
            f"the Docker daemon does not answer ({exc}); start dockerd (scripts/test.sh "
            "does) or use the bwrap sandbox backend"
        ) from exc
    return client


def image_exists(image: str, client=None) -> bool:
    """True when ``image`` is on the daemon (``client``: a ``docker.DockerClient``, default
    ``docker_client()``).

    Raises:
        SandboxError: the daemon does not answer.
    """
    import docker.errors


    client = client if client is not None else docker_client()
    try:
        client.api.inspect_image(image)
    except docker.errors.ImageNotFound:
        return False
    except infra_errors() as exc:
        raise SandboxError(f"the Docker daemon does not answer: {exc}") from exc
    return True


def image_workdir(image: str, client=None) -> str | None:
    """The working directory ``image`` declares (its ``WORKDIR``, inherited ones included);
    None when it declares none. ``client``: a ``docker.DockerClient``, default
    ``docker_client()``.

    Raises:
        SandboxError: ``image`` is not on the daemon, or the daemon does not answer.
    """
    import docker.errors

    client = client if client is not None else docker_client()
    try:
        config = client.api.inspect_image(image).get("Config") or {}
    except docker.errors.ImageNotFound as exc:
        raise SandboxError(f"image={image!r} is not on this Docker daemon (there is no registry to pull "
                           "from); build it first") from exc
    except infra_errors() as exc:
        raise SandboxError(f"the Docker daemon does not answer: {exc}") from exc
    return config.get("WorkingDir") or None


def base_recipe(suite: str = DEFAULT_SUITE, mirror: str = DEFAULT_MIRROR) -> str:
    """SHA-256 (hex) of the base image's recipe."""
    parts = [BASE_RECIPE_VERSION, suite, mirror, *BASE_PACKAGES, str(SANDBOX_UID)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def dockerfile_recipe(dockerfile: Path, context: Path, from_image_ids: list[str]) -> str:
    """SHA-256 (hex) of a Dockerfile build: the Dockerfile, every regular file and symlink
    of ``context`` (path, mode, content), and the ids of the images it starts ``FROM``."""
    h = hashlib.sha256()
    h.update(b"dockerfile\0" + dockerfile.read_bytes() + b"\0")
    for image_id in from_image_ids:
        h.update(b"from\0" + image_id.encode() + b"\0")
    for root, dirs, files in os.walk(context):
        dirs.sort()
        for name in sorted(files):
            p = Path(root, name)
            rel = p.relative_to(context).as_posix()
            st = p.lstat()
            h.update(f"file\0{rel}\0{st.st_mode:o}\0".encode())
            if p.is_symlink():
                h.update(os.readlink(p).encode())
            elif p.is_file():
                with open(p, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        h.update(chunk)
            h.update(b"\0")
    return h.hexdigest()


def _from_images(dockerfile: Path) -> list[str]:
    names = []
    for line in dockerfile.read_text().splitlines():
        m = re.match(r"^\s*FROM\s+(?:--platform=\S+\s+)?(\S+)", line, re.IGNORECASE)
        if m:
            names.append(m.group(1))
    if not names:
        raise ConfigError(f"dockerfile={str(dockerfile)!r} has no FROM line")
    return names


def _existing_recipe(client, name: str) -> str | None:
    import docker.errors

    try:
        image = client.images.get(name)
    except docker.errors.ImageNotFound:
        return None
    return (image.labels or {}).get(RECIPE_LABEL)


def build_image(
    name: str = BASE_IMAGE,
    *,
    dockerfile: str | os.PathLike | None = None,
    context: str | os.PathLike | None = None,
    suite: str = DEFAULT_SUITE,
    mirror: str = DEFAULT_MIRROR,
    force: bool = False,
    progress: Progress | None = None,
    client=None,
) -> str:
    """Build a sandbox image unless an image of that name with the same recipe exists.

    Without ``dockerfile``: the base image (Debian ``suite`` minbase with
    ``python3`` and its standard library, user ``sandbox`` uid/gid 1000, ``/work`` owned by it) from
    ``mirror`` with ``debootstrap`` (needs root and the ``debootstrap`` package; about
    40 s and 150 MB). With ``dockerfile``: ``docker build`` of it over ``context`` (default:
    the Dockerfile's directory), without pulling; its ``FROM`` images must exist locally
    (build the base image first).

    Args:
        name: image name and tag, e.g. ``"agentrl-base:latest"`` or ``"my-env:v1"``.
        dockerfile: path of a Dockerfile, or ``None`` for the base image.
        context: build context directory (Dockerfile builds only).
        suite, mirror: Debian suite and mirror (base image only).
        force: rebuild even when the recipe is unchanged.
        progress: called with one line of text per step (the CLI prints them).
        client: the ``docker.DockerClient`` to build with (default: one of ``DOCKER_HOST``,
            else the default socket, made for this call).

    Returns:
        The image id (``sha256:...``).

    Raises:
        ConfigError: invalid ``name``, missing Dockerfile or context, no ``FROM`` line,
            ``context`` without ``dockerfile``.
        SandboxError: the Docker daemon does not answer, ``debootstrap`` is missing or
            fails, not root, a ``FROM`` image is missing, or the build fails (its log in
            the message).
    """
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ConfigError(
            f"name={name!r} is not a valid image name; expected e.g. 'agentrl-base:latest'"
        )
    if dockerfile is None and context is not None:
        raise ConfigError(f"context={str(context)!r} needs a dockerfile")
    client = client if client is not None else _client()
    previous = _image_id(client, name)
    new_id = _build(client, name, dockerfile, context, suite, mirror, force, progress)
    if previous is not None and previous != new_id:
        # The old build lost its name; drop it unless something still uses it.
        try:
            client.images.remove(previous)
        except Exception:  # noqa: BLE001 - in use by a container or another tag: keep it
            pass
    return new_id


def _image_id(client, name: str) -> str | None:
    import docker.errors

    try:
        return client.images.get(name).id
    except docker.errors.ImageNotFound:
        return None


def _build(client, name, dockerfile, context, suite, mirror, force, progress) -> str:
    if dockerfile is None:
        recipe = base_recipe(suite, mirror)
        if not force and _existing_recipe(client, name) == recipe:
            _say(progress, f"{name} is up to date (recipe {recipe[:12]})")
            return client.images.get(name).id
        return _build_base(client, name, recipe, suite, mirror, progress)

    df = Path(dockerfile).resolve()
    if not df.is_file():
        raise ConfigError(f"dockerfile={str(dockerfile)!r} does not exist or is not a file")
    ctx = Path(context).resolve() if context is not None else df.parent
    if not ctx.is_dir():
        raise ConfigError(f"context={str(context)!r} is not a directory")
    import docker.errors

    from_ids = []
    for ref in _from_images(df):
        if ref.lower() == "scratch":
            continue
        try:
            from_ids.append(client.images.get(ref).id)
        except docker.errors.ImageNotFound as exc:
            raise SandboxError(
                f"{df} starts FROM {ref!r}, which is not a local image and cannot be pulled "
                f"(no registry); build it first (agentrl sandbox build-image)"
            ) from exc
    recipe = dockerfile_recipe(df, ctx, from_ids)
    if not force and _existing_recipe(client, name) == recipe:
        _say(progress, f"{name} is up to date (recipe {recipe[:12]})")
        return client.images.get(name).id
    _say(progress, f"building {name} from {df}")
    try:
        rel_df = str(df.relative_to(ctx))
    except ValueError:
        rel_df = str(df)
    log: list[str] = []
    try:
        for chunk in client.api.build(
            path=str(ctx), dockerfile=rel_df, tag=name, rm=True, forcerm=True, pull=False,
            labels={RECIPE_LABEL: recipe}, decode=True, network_mode="none",
        ):
            if "stream" in chunk:
                line = chunk["stream"].rstrip()
                if line:
                    log.append(line)
                    _say(progress, line)
            if "error" in chunk:
                raise SandboxError(
                    f"docker build of {name} failed: {chunk['error'].strip()}\n"
                    + "\n".join(log[-30:])
                )
    except docker.errors.APIError as exc:
        raise SandboxError(f"docker build of {name} failed: {exc}") from exc
    return client.images.get(name).id


def _build_base(client, name: str, recipe: str, suite: str, mirror: str, progress: Progress | None) -> str:
    debootstrap = shutil.which("debootstrap") or (
        "/usr/sbin/debootstrap" if os.path.exists("/usr/sbin/debootstrap") else None
    )
    if debootstrap is None:
        raise SandboxError("debootstrap not found; apt-get install -y debootstrap (scripts/install.sh does)")
    if os.getuid() != 0:
        raise SandboxError("building the base image needs root (debootstrap); run as root or with sudo")
    with tempfile.TemporaryDirectory(prefix="agentrl-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        _say(progress, f"debootstrap --variant=minbase {suite} (about 40 s)")
        cmd = [
            debootstrap, "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", suite,
            str(rootfs), mirror,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr)[-3000:]
            raise SandboxError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{tail}")
        _customize_rootfs(rootfs)
        tar_path = Path(tmp) / "rootfs.tar"
        _say(progress, f"importing the root file system as {name}")
        with tarfile.open(tar_path, "w") as tar:
            for entry in sorted(os.listdir(rootfs)):
                tar.add(rootfs / entry, arcname=entry)
        repo, _, tag = name.partition(":")
        import docker.errors

        try:
            client.api.import_image_from_file(
                str(tar_path), repository=repo, tag=tag or "latest",
                changes=[
                    f"LABEL {RECIPE_LABEL}={recipe}",
                    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8",
                    f"USER {SANDBOX_UID}:{SANDBOX_UID}",
                    "WORKDIR /work",
                    'CMD ["/bin/sh"]',
                ],
            )
        except docker.errors.APIError as exc:
            raise SandboxError(f"docker import of {name} failed: {exc}") from exc
    image_id = client.images.get(name).id
    _say(progress, f"built {name} ({image_id[:19]}, recipe {recipe[:12]})")
    return image_id


def _customize_rootfs(rootfs: Path) -> None:
    """Add the ``sandbox`` user and ``/work``; drop apt caches and device nodes Docker
    provides itself."""
    with open(rootfs / "etc/passwd", "a") as f:
        f.write(f"sandbox:x:{SANDBOX_UID}:{SANDBOX_UID}:sandbox:/work:/bin/sh\n")
    with open(rootfs / "etc/group", "a") as f:
        f.write(f"sandbox:x:{SANDBOX_UID}:\n")
    work = rootfs / "work"
    work.mkdir(exist_ok=True)
    os.chown(work, SANDBOX_UID, SANDBOX_UID)
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
        d = rootfs / junk
        if d.is_dir():
            for p in d.iterdir():
                if p.is_file():
                    p.unlink()
    dev = rootfs / "dev"
    if dev.is_dir():
        shutil.rmtree(dev)
        dev.mkdir()
