"""ncpsim's command line: `ncpsim up scenario=grpc-callback`, `ncpsim down`, `ncpsim status --json`, ...

One collection for both programs: `ncpsim` (tasks/program.py, from any folder) and `invoke` run in the
repository, which finds this package as its `tasks` collection. Each module holds thin tasks of one kind.
"""

from __future__ import annotations

from invoke import Collection

from tasks import catalogue, dev, devenv, stack, support

ns = Collection(
    stack.up,
    stack.down,
    stack.status,
    stack.logs,
    stack.events,
    stack.certs,
    stack.ls,
    stack.values,
    devenv.call,
    devenv.fault,
    devenv.rotate,
    devenv.set_,
    devenv.step,
    devenv.watch,
    catalogue.scenarios,
    catalogue.replay,
    catalogue.render,
    support.diagnose,
    support.collect_script,
    support.doctor,
    support.dns_rewrite,
    dev.bench,
    dev.test,
)
