"""What impl.machine reads from the OS: the cgroup's CPU quota (v2 and v1 layouts)."""

import pytest

from replaybench.impl.machine import cpu_quota


@pytest.mark.parametrize("files, quota", [
    ({"cpu.max": "400000 100000\n"}, 4.0),
    ({"cpu.max": "150000 100000\n"}, 1.5),
    ({"cpu.max": "max 100000\n"}, None),
    ({"cpu/cpu.cfs_quota_us": "200000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 2.0),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    ({}, None),
])
def test_cpu_quota_reads_the_cgroup_s_quota_over_its_period(tmp_path, files, quota):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cpu_quota(str(tmp_path)) == quota
