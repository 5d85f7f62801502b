"""The job's coordinator services, hosted by one gRPC server on rank 0 (one port, one job secret).

One folder per service, each with its plain state machine (no gRPC, no clock of its own), its gRPC servicer
(``service``), the ranks' side (``client``) and one ``.proto`` in ``protos/``:

====================  =======================================================================================
``group_generator/``  Ripples' Group Generator (§4.1, §5, §6.2): who P-Reduces with whom, when
``state_server/``     ESync's State Server (§4.1, Algorithm 2): READY / NOT-READY before each local step
``switchboard/``      live mode switches agreed at one step, and sync="auto"'s policy
``job_clock/``        the job's train steps per epoch, shared by speed, and the agreed stop step
====================  =======================================================================================

Shared: ``server`` (the one server hosting every servicer), ``services`` (rank 0 starts them, every rank connects),
``auth`` (the job secret every servicer checks), ``_proto`` (generates the gRPC modules from ``protos/``).
Importing this package, or a service's package, loads no gRPC.  See docs/group_generator.md.
"""
