"""IMAGE_BINDS (standalone/config.py): an image may name extra read-only binds, so a host virtualenv with Hermes can
serve as the hermes-agent image. The parsing and checks are pure; bwrap_argv places the binds."""

# ruff: noqa: S108 - "/tmp/..." here are bwrap arguments or sandbox paths, never opened

import pytest
from test_bwrap_argv import build, mounts

from standalone import config
from standalone.config import ImageBind, check_image_binds, image_binds, load_settings, parse_image_binds

VENV = "/srv/hermes-venv"


def test_unset_or_empty_means_no_binds():
    assert parse_image_binds(None) == {}
    assert parse_image_binds("") == {}
    assert parse_image_binds(" , ,") == {}


def test_entries_per_image_in_order():
    binds = parse_image_binds(
        f" hermes-agent={VENV}:/opt/hermes , hermes-agent=/srv/py:/opt/py,other=/data/tools:/opt/tools/bin"
    )
    assert binds == {
        "hermes-agent": (ImageBind(VENV, "/opt/hermes"), ImageBind("/srv/py", "/opt/py")),
        "other": (ImageBind("/data/tools", "/opt/tools/bin"),),
    }


@pytest.mark.parametrize(
    "value",
    [
        "hermes-agent",  # no =
        f"hermes-agent={VENV}",  # no sandbox path
        f"={VENV}:/opt/hermes",  # no image
        f"bad image={VENV}:/opt/hermes",  # not an image name
        "hermes-agent=relative/venv:/opt/hermes",
        f"hermes-agent={VENV}:opt/hermes",
        f"hermes-agent={VENV}/../etc:/opt/hermes",  # not normalised
        f"hermes-agent={VENV}:/opt/./hermes",
        f"hermes-agent={VENV}/:/opt/hermes",  # a trailing slash is not normalised either
        f"hermes-agent={VENV}://opt/hermes",
        f"hermes-agent={VENV}:/opt/hermes:/x",  # a path with a colon cannot be written
    ],
)
def test_malformed_entries_are_refused(value):
    with pytest.raises(ValueError, match="IMAGE_BINDS"):
        parse_image_binds(value)


@pytest.mark.parametrize(
    "target",
    [
        "/",
        "/workspace",
        "/workspace/venv",
        "/home",
        "/home/sandbox/.venv",
        "/tmp",
        "/tmp/x",
        "/var/tmp",
        "/run/x",
        "/proc",
        "/dev/shm",
        "/etc",
        "/usr",
        "/usr/local",
        "/bin",
        "/sbin",
        "/lib",
        "/lib64/x",
        "/lib32",
        "/libx32",
    ],
)
def test_a_bind_never_covers_what_every_sandbox_has(target):
    with pytest.raises(ValueError, match="would cover"):
        parse_image_binds(f"hermes-agent={VENV}:{target}")


@pytest.mark.parametrize("target", ["/opt/hermes", "/srv/x", "/workspaces", "/homes", "/usrx", "/root/.pyenv/py"])
def test_other_places_are_fine(target):
    assert parse_image_binds(f"hermes-agent={VENV}:{target}") == {"hermes-agent": (ImageBind(VENV, target),)}


def test_one_image_cannot_bind_a_path_twice():
    with pytest.raises(ValueError, match="twice"):
        parse_image_binds(f"hermes-agent={VENV}:/opt/hermes,hermes-agent=/srv/other:/opt/hermes")
    # two images may use the same path
    assert len(parse_image_binds(f"a={VENV}:/opt/hermes,b=/srv/other:/opt/hermes")) == 2


def test_check_wants_known_images_and_existing_host_paths():
    binds = parse_image_binds(f"hermes-agent={VENV}:/opt/hermes")
    check_image_binds(binds, ("hermes", "hermes-agent"), exists=lambda p: p == VENV)
    with pytest.raises(ValueError, match="not in IMAGES"):
        check_image_binds(binds, ("hermes",), exists=lambda p: True)
    with pytest.raises(ValueError, match="does not exist"):
        check_image_binds(binds, ("hermes", "hermes-agent"), exists=lambda p: False)


def test_load_settings_refuses_a_bad_image_binds_at_start(tmp_path):
    wrangler = tmp_path / "wrangler.jsonc"
    wrangler.write_text('{"vars": {"IMAGES": "hermes"}}')
    venv = tmp_path / "venv"
    venv.mkdir()
    good = {"IMAGES": "hermes,hermes-agent", "IMAGE_BINDS": f"hermes-agent={venv}:/opt/hermes"}
    assert load_settings(good, wrangler).images == ("hermes", "hermes-agent")
    assert image_binds(good, ("hermes", "hermes-agent")) == {"hermes-agent": (ImageBind(str(venv), "/opt/hermes"),)}
    with pytest.raises(ValueError, match="not in IMAGES"):
        load_settings({"IMAGE_BINDS": f"hermes-agent={venv}:/opt/hermes"}, wrangler)
    with pytest.raises(ValueError, match="does not exist"):
        load_settings({**good, "IMAGE_BINDS": f"hermes-agent={venv}-gone:/opt/hermes"}, wrangler)
    with pytest.raises(ValueError, match="would cover"):
        load_settings({**good, "IMAGE_BINDS": f"hermes-agent={venv}:/usr/lib/hermes"}, wrangler)


def test_image_binds_is_not_a_wrangler_var():
    # host paths mean nothing to the Cloudflare deployment: the variable comes from the environment only
    assert config.IMAGE_BINDS_VAR not in config.SETTING_VARS


def test_bwrap_binds_them_read_only_before_the_python_sources():
    argv = build(image_binds=[("/tmp/9", "/opt/hermes"), ("/srv/py", "/opt/py-extra")])
    ops = mounts(argv)
    hermes = ops.index(("--ro-bind", "/tmp/9", "/opt/hermes"))
    extra = ops.index(("--ro-bind", "/srv/py", "/opt/py-extra"))
    python = ops.index(("--ro-bind", "/opt/py", "/opt/py"))
    live = max(i for i, op in enumerate(ops) if op[0] == "--bind")
    assert live < hermes < extra < python < ops.index(("--remount-ro", "/"))
    assert not any(op[0] == "--bind" and op[2].startswith("/opt") for op in ops)  # never writable


def test_no_binds_no_change():
    assert build() == build(image_binds=())
