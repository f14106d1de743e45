"""The data dir's disk reserve (standalone/reserve.py) with several worker processes sharing the data dir: each
process holds its own DiskReserve on the same file, so two of them can find the disk full at the same moment."""

from pathlib import Path

from standalone.reserve import DiskReserve

SIZE = 64 * 1024


class _SeenBeforeAnotherUnlinked(type(Path())):
    """The file as one process saw it an instant before another process unlinked it."""

    def exists(self, *args, **kwargs) -> bool:
        return True


def test_two_processes_releasing_at_once_give_it_once_and_never_fail(tmp_path):
    first = DiskReserve(tmp_path / "disk-reserve", SIZE)
    second = DiskReserve(tmp_path / "disk-reserve", SIZE)
    assert first.held and second.held
    second.path = _SeenBeforeAnotherUnlinked(second.path)
    assert first.release() is True
    assert second.release() is False  # nothing left to give; a full disk is then storage_full, not a crash
    assert not (tmp_path / "disk-reserve").exists()


def test_a_spent_reserve_is_put_back_once_the_disk_has_room(tmp_path):
    reserve = DiskReserve(tmp_path / "disk-reserve", SIZE)
    assert reserve.release() is True and not reserve.held
    assert reserve.release() is False
    assert reserve.ensure() is True and (tmp_path / "disk-reserve").stat().st_size == SIZE
