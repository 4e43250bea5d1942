"""Choosing the SLURM status command before anything is submitted (no cluster needed: the probes'
answers are given; tests/test_slurm.py runs the real check against the local cluster)."""

from __future__ import annotations

import shutil

import pytest

from trainbench.execute.slurm import Probe, StatusCommandError, choose_status_command

BROKEN_SACCT = Probe(False, "sacct failed: Slurm accounting storage is disabled")


def probes(**answers: Probe):
    return lambda command: answers[command]


def test_a_working_status_command_is_kept_silently():
    assert choose_status_command("sacct", first_check_s=40,
                                 probe_fn=probes(sacct=Probe(True))) == ("sacct", None)


def test_a_cluster_without_accounting_is_followed_with_squeue_and_the_user_told_which_flag(monkeypatch):
    command, message = choose_status_command("sacct", first_check_s=40,
                                             probe_fn=probes(sacct=BROKEN_SACCT, squeue=Probe(True)),
                                             min_job_age_fn=lambda: 300)
    assert command == "squeue"
    assert "accounting storage is disabled" in message and "--slurm-status-command squeue" in message


def test_no_working_status_command_stops_the_workflow_naming_both_problems():
    with pytest.raises(StatusCommandError, match="sacct failed.*squeue is not installed"):
        choose_status_command("sacct", first_check_s=40,
                              probe_fn=probes(sacct=BROKEN_SACCT,
                                              squeue=Probe(False, "squeue is not installed")))


@pytest.mark.skipif(shutil.which("sacct") is None,
                    reason="the plugin's fallback to sacct needs sacct installed")
def test_squeue_is_refused_where_the_plugin_would_fall_back_to_a_broken_sacct():
    # MinJobAge 60 s < 3 x 40 s: the plugin would swap squeue for sacct, which cannot answer here
    with pytest.raises(StatusCommandError, match="MinJobAge=60 s"):
        choose_status_command("squeue", first_check_s=40,
                              probe_fn=probes(sacct=BROKEN_SACCT, squeue=Probe(True)),
                              min_job_age_fn=lambda: 60)
    assert choose_status_command("squeue", first_check_s=5,
                                 probe_fn=probes(sacct=BROKEN_SACCT, squeue=Probe(True)),
                                 min_job_age_fn=lambda: 60) == ("squeue", None)
