"""`ncpsim diagnose`: a customer's values file or support bundle, brought up and probed, turned into ranked
findings and a ticket that replays them.

causes.py holds what the seeds document (each cause's seed section and fix), symptoms.py maps what a
worker or client logged to the causes that produce it, judge.py turns observations into findings and
facts.py judges what the customer's files show (all pure); customer.py reads what the customer told,
profiles.py the probe workers, plan.py which probe stacks to bring up, probe.py brings them up and
observes them, diagnosis.py ranks it all, report.py prints it; ticket.py, refusal.py and assemble.py
write the ticket.
"""
