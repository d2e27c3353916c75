"""The suite's two markers. `e2e`: the test starts a stack, or a real process that is not a trivial one.
`long`: left out unless the `-m` expression names it (`pytest -m long`, `ncpsim test --long`).

`pytest -m "not e2e"` is the quick loop (README, Testing). A test is e2e when it uses a fixture that starts a
stack, or its module or its name is in MODULES below. Names are checked at collection: a renamed test must not
drop out of the table silently (it would then run in the quick loop, or a typo here would mark nothing).
"""

from __future__ import annotations

import pytest

# Fixtures that start a stack (scenarios/pytest_plugin.py, conftest.py) or hand a test a user's environment
# for the processes it starts.
STACK_FIXTURES = frozenset(
    {
        "ncpsim_stack",
        "ncpsim_stack_module",
        "ncpsim_stack_session",
        "ncpsim_replay",
        "http_stack",
        "invoke_env",
        "sigint_as_on_a_terminal",
    }
)
ALL = None  # every test of the module

# module -> ALL, or the tests of that module that are e2e (function names, without parameters).
MODULES: dict[str, frozenset[str] | None] = {
    "test_bench_harness.py": frozenset({"test_minted_callbacks_through_proxy_nginx_and_direct"}),
    "test_bench_peers.py": frozenset({"test_sections_without_their_peers_are_skipped_not_failed"}),
    "test_bundle_archive.py": frozenset({"test_a_hostile_archive_is_refused_in_one_line"}),
    "test_bundle_collect.py": ALL,  # the collector script against fake kubectl and helm
    "test_bundle_diagnose.py": frozenset(
        {
            "test_a_bundles_ticket_replays_as_seen_then_fixed",
            "test_a_forwarded_domain_is_an_assumption_not_a_guess",
            "test_a_healthy_bundle_exits_0_within_its_budget",
            "test_a_healthy_token_mode_file_whose_api_runs_elsewhere_gives_no_finding",
            "test_a_rewrite_to_a_service_the_compute_cluster_lacks",
            "test_an_exact_record_alone_is_a_finding_for_grpc",
            "test_diagnose_bundle_names_the_cause_first",
            "test_replay_bundle_replays_the_customers_world",
            "test_replay_takes_a_secret_folder",
            "test_the_bundle_shows_each_cause_citing_its_file",
            "test_up_bundle_brings_the_customers_world_up",
        }
    ),
    "test_catalogue.py": frozenset(  # the tests that read the module's replay of the whole catalogue
        {
            "test_catalogue_scenario_passes",
            "test_junit_has_one_testcase_per_scenario",
            "test_reports_say_what_was_assumed",
            "test_stacks_are_stopped_and_reports_kept",
            "test_two_at_a_time_each_on_its_own_stack_reported_in_catalogue_order",
            "test_whole_catalogue_within_budget",
        }
    ),
    "test_cli.py": ALL,
    "test_cli_state.py": ALL,
    "test_customer_world_e2e.py": ALL,
    "test_devenv.py": frozenset(
        {
            "test_a_closed_pipe_ends_output_quietly",
            "test_idle_stack_poked_as_a_user_would",
            "test_idle_up_with_a_customer_values_file",
            "test_logs_without_a_component_prints_them_all",
            "test_optional_positional_words",
            "test_probe_steps_repeat_on_a_running_stack",
            "test_replay_takes_help_and_stack",
            "test_status_of_a_stack_that_is_not_up_says_how_to_start_it",
            "test_step_from_stdin_checks_its_expectations",
        }
    ),
    "test_diagnose.py": frozenset(
        {
            "test_a_ticket_never_overwrites_its_inputs_nor_follows_a_link",
            "test_each_cause_is_named_first_with_its_fix",
            "test_each_causes_ticket_replays_as_seen_then_fixed",
            "test_healthy_values_give_no_findings_and_exit_0",
            "test_missing_pem_is_named_first_and_its_ticket_replays",
            "test_old_workers_with_connect_off",
        }
    ),
    "test_diagnose_interrupt.py": ALL,
    "test_dns_fuzz.py": frozenset({"test_mutated_queries_never_raise_and_replies_parse"}),
    "test_e2e_http.py": ALL,
    "test_envoy_fidelity.py": ALL,
    "test_envoy_fidelity_failures.py": ALL,
    "test_faults.py": ALL,
    "test_full_disk.py": frozenset({"test_up_call_down_on_a_full_tmpfs"}),
    "test_fuzz_files.py": ALL,
    "test_grpc_e2e.py": ALL,
    "test_h3_pool.py": ALL,
    "test_hostile_files.py": frozenset(  # real processes: three writers at once, an up under a memory cap
        {
            "test_link_faults_written_at_once_by_two_commands_both_succeed",
            "test_up_refuses_the_alias_bomb_under_an_address_space_limit",
        }
    ),
    "test_hostile_callout.py": ALL,  # one token-mode stack for the module
    "test_hostile_h3.py": ALL,
    "test_hostile_h3_frames.py": ALL,  # one grpc-callback stack for the module
    "test_hostile_http.py": ALL,
    "test_k3d_commands.py": frozenset(
        {
            "test_failed_image_build_rolls_back_too",
            "test_failure_midway_rolls_back_what_this_run_created",
            "test_second_up_is_idempotent_and_down_removes_everything",
            "test_up_runs_the_exact_sequence_and_the_fakes_saw_it",
        }
    ),
    "test_k3d_coredns.py": frozenset(
        {
            "test_assume_yes_and_an_existing_service_apply_only_the_rewrite",
            "test_missing_service_takes_ncpsims_own_proxy_address",
        }
    ),
    "test_k3d_pod.py": frozenset({"test_entrypoint_names_its_kinds"}),
    "test_launcher.py": frozenset(
        {
            "test_a_restarted_component_is_the_supervisors_child",
            "test_down_with_the_supervisor_killed_first_still_stops_everything",
        }
    ),
    "test_log_expect.py": frozenset({"test_proxy_access_log_passes_and_a_changed_bound_fails"}),
    "test_nats_api_location.py": ALL,
    "test_nats_auth.py": ALL,
    "test_nats_callout_logging.py": frozenset(
        {"test_150_workers_at_once_leave_about_100_lines_a_second_until_sampling_is_off"}
    ),
    "test_nats_cluster.py": ALL,
    "test_nats_redelivery.py": ALL,
    "test_nats_server.py": ALL,
    "test_nats_stack.py": ALL,
    "test_nats_workqueue.py": ALL,
    "test_negative_upstream.py": ALL,
    "test_plugin.py": ALL,
    "test_policy_props.py": frozenset(
        {
            "test_decide_never_forwards_outside_the_allowed_form",
            "test_wire_bytes_through_h11_never_forward_outside_the_allowed_form",
        }
    ),
    "test_precedence.py": frozenset(
        {"test_customer_file_wins_end_to_end", "test_replay_takes_repeated_files_and_sets_and_warns_once"}
    ),
    "test_printed_commands.py": ALL,
    "test_program.py": frozenset(
        {
            "test_ls_lists_replay_stacks_and_down_all_purge_removes_them",
            "test_version_and_a_task_from_outside_the_repository",
        }
    ),
    "test_proxy_listener.py": ALL,
    "test_replay_interrupt.py": ALL,
    "test_report_failing.py": ALL,
    "test_rotation.py": ALL,
    "test_runbook_registry.py": frozenset(
        {
            "test_catalogue_scenarios_pass_through_the_replay_engine",
            "test_every_runbook_right_passes_and_wrong_names_mistake_and_fix",
            "test_log_sampling_logs_every_sign_in_only_once_sampling_is_off",
        }
    ),
    "test_runbook_values.py": frozenset({"test_ncpsim_replay_with_f_shows_it"}),
    "test_state_folder.py": frozenset(
        {
            "test_status_after_up_is_sigkilled_mid_start",
            "test_two_simultaneous_ups_one_wins_and_the_loser_stops_nothing",
            "test_up_refuses_a_planted_link",
        }
    ),
    "test_startup_imports.py": ALL,  # an `ncpsim up` process up to its first fork, and its zygote
    "test_state_root_unreadable.py": frozenset(
        {
            "test_a_stack_folder_it_cannot_read_is_one_line",
            "test_a_current_folder_deleted_under_the_shell_is_one_line",
        }
    ),
    "test_status_contract.py": ALL,
    "test_teardown.py": ALL,
    "test_terminal_invisible.py": frozenset({"test_a_replay_report_shows_bidi_controls_escaped"}),
    "test_types.py": ALL,  # mypy: seconds of a process of its own
    "test_watch.py": ALL,
    "test_worker_pool.py": ALL,
    "test_zygote.py": ALL,
}


def mark_e2e(items: list[pytest.Item]) -> None:
    """Add the e2e marker where the table or a stack fixture says so. A name in the table that its module
    does not define is an error."""
    stale: set[str] = set()
    for item in items:
        module, name = item.path.name, getattr(item, "originalname", item.name)
        chosen = MODULES.get(module, frozenset())
        stale.update(f"{module}::{n}" for n in chosen or () if not hasattr(getattr(item, "module", None), n))
        stack = STACK_FIXTURES & set(getattr(item, "fixturenames", ()))
        if (module in MODULES and chosen is ALL) or (chosen and name in chosen) or stack:
            item.add_marker(pytest.mark.e2e)
    if stale:
        raise pytest.UsageError(f"tests/markers.py names tests that do not exist: {sorted(stale)}")


def without_long(config: pytest.Config, items: list[pytest.Item]) -> list[pytest.Item]:
    """The long tests are deselected unless the `-m` expression names them: a `-m` of one's own (the quick
    loop's "not e2e") would otherwise replace a `-m 'not long'` in addopts, and run them."""
    if "long" in (config.option.markexpr or ""):
        return items
    long = [item for item in items if item.get_closest_marker("long")]
    if long:
        config.hook.pytest_deselected(items=long)
    return [item for item in items if not item.get_closest_marker("long")]
