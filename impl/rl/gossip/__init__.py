"""Learners that gossip their models instead of waiting on a barrier (GALA / PALA).

==========  ===============================================================
exchange    gossip averaging of models between learners by point-to-point messages
learner     one gossip / all-reduce / independent A2C learner process and the run's result
launch      starts a run's learner processes on loopback nodes or machines, as torchrun does
==========  ===============================================================
"""
