"""MPS: GPUs shared through NVIDIA's MPS control daemons, for claims and for the device plugin.

Why it is a package of its own: the daemons (``daemons``: one per GPU or set of GPUs, run as
processes or as Pods: ``mpsprocess``, ``mpspod``, ``mpspodspec``, ``mpsrunner``), their records
and steps (``mpsrecords``, ``mpssteps``), a claim's use of them (``mpsclaims``) and the stand-in
that loads all that only when a claim first needs it (``lazymps``) are one subsystem that most
nodes never run. It builds on the driver core (claims, checkpoint, config, CDI); the core
reaches it only through :class:`dra_driver.driver.mpspart.MpsPart`, handed in by the
composition root (``dra_driver/agentparts.py``), and never imports this package. This file
imports nothing, so that loading ``lazymps`` loads no other MPS module.
"""
