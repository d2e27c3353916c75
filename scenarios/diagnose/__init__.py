"""`ncpsim diagnose`: a customer's values file, brought up and probed, turned into ranked findings.

causes.py holds what the seeds document (each cause's seed section and fix), symptoms.py maps what a
worker or client logged to the causes that produce it, judge.py turns observations into findings (all
three pure); probe.py brings the customer's world up on the local backend and observes it.
"""
