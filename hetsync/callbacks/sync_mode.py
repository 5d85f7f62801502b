"""``hetsync.callbacks.SyncModeCallback``: change the sync mode while ``hetsync.keras.fit`` runs (README "Switching").

    switch = hetsync.callbacks.SyncModeCallback(schedule={0: "allreduce", 3: ("ripples-smart", {"group_size": 3})})
    hetsync.keras.fit(model, ..., callbacks=[..., switch])
    switch.request("eager-solo")      # the flag: from any callback or thread, on any rank

Pass it on every rank, as Horovod's callbacks are (a rank without it would never hear of a switch: ``fit`` raises a
ValueError naming the ranks).  The switch itself is hetsync's (hetsync/switching.py): this callback holds the
schedule and sends requests to the Switch Board (hetsync/coordinator/switchboard/), which picks the step at which
every rank switches.  Rule for several requests: the first one the board receives wins; requests that arrive
before that switch has been carried out on every rank are dropped (``request`` returns "superseded").  At the
switch's step every rank checks the new mode again (its roll call, hetsync/switching.py): if the check fails on any
rank, the switch is refused on every rank, recorded in ``refusals``, and training goes on in the mode in force.
"""
import logging

from hetsync import _runtime, algorithms
from hetsync.coordinator import switchboard
from hetsync.switching import parse_target
from hetsync.training.hooks import SwitchSchedule

log = logging.getLogger("hetsync.callbacks")


class SyncModeCallback(SwitchSchedule):
    """Live sync-mode switches: a per-epoch ``schedule`` and ``request(mode, **options)``, the flag.

    Args:
      schedule: {epoch: mode or (mode, options)}: the mode from that epoch's first step on.  Every rank applies it
        at the same epoch start; nothing is negotiated.  An entry equal to the mode in force does nothing.
      verbose: rank 0 logs a line per switch (logger "hetsync", default True).
    """

    def __init__(self, schedule=None, verbose=True):
        super().__init__()

        self.schedule = {}
        for epoch, value in (schedule or {}).items():
            if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
                raise ValueError(f"schedule keys are epochs (ints >= 0), got {epoch!r}")
            mode, options = parse_target(value)
            _validate(mode, options, None)
            self.schedule[epoch] = (mode, options)
        self.verbose = bool(verbose)
        self._sync_points = None
        # this rank's requests: (mode, options, status, pending), pending = the mode of the switch that superseded
        # it (None unless status is "superseded"); a request superseded by an earlier switch that this rank has
        # already carried out (pending == self.mode) may be sent again: the board is free once every rank has.
        self.requests = []
        # this rank's last accepted request not yet seen carried out or refused: (mode, len(history), len(refusals))
        self._awaiting = None

    def bind(self, sync_points):
        """hetsync/training/, at on_train_begin: the rank state of the fit this callback belongs to."""
        self._sync_points = sync_points
        for mode, options in self.schedule.values():
            _validate(mode, options, sync_points.family)

    def request(self, mode, options=None, **kwargs):
        """Asks the job to switch to ``mode`` (options as a dict and/or keywords).  Returns the Switch Board's
        answer: "accepted" (every rank will switch at a step the board picks), "superseded" (another switch is
        pending: this request is dropped) or "unchanged" (that mode with those options is in force).  An unknown
        mode or option raises ValueError here, on this rank only; training goes on as before."""
        options = {**(options or {}), **kwargs}

        mode = algorithms.canonical(mode)  # "ripples_smart" is "ripples-smart"
        family = self._sync_points.family if self._sync_points is not None else None
        _validate(mode, options, family)

        status, pending = _runtime.services().switch_client().request(mode, switchboard.canonical(options))
        self.requests.append((mode, options, status, pending if status == "superseded" else None))
        if status == "accepted":
            self._awaiting = (mode, len(self.history), len(self.refusals))
        if status != "accepted" and self.verbose:
            extra = f" (switch to {pending} pending)" if pending else ""
            # a dropped request is worth a warning on the rank that made it; "unchanged" is not
            log.log(logging.WARNING if status == "superseded" else logging.INFO, "request for %r %s%s", mode, status,
                    extra)
        return status

    def on_train_end(self, logs=None):
        """Says so on this rank when the switch it asked for was not carried out in this fit: the Switch Board's
        step for it fell past the fit's end, so it happens in the process's next fit, or never if none follows
        (docs/switching.md).  Without the line, a script whose last fit ends just after a request never learns."""
        if self._awaiting is None:
            return
        mode, switched, refused = self._awaiting
        if any(h["to"] == mode for h in self.history[switched:] + self.refusals[refused:]):
            self._awaiting = None
        elif self.verbose:
            log.warning("the switch to %r requested on this rank was agreed for a step past this fit's end: it is "
                        "carried out at the first steps of this process's next fit, and not at all if no fit "
                        "follows", mode)

    @property
    def history(self):
        """The switches carried out on this rank (dicts: id, from, to, options, reason, position, time, seconds)."""
        family = self._sync_points.family if self._sync_points is not None else None
        return list(family.history) if family is not None else []

    @property
    def refusals(self):
        """Switches refused on every rank at their roll call (dicts: id, from, to, options, reason, position,
        refused: the reasons, naming the ranks where the new mode failed its checks)."""
        family = self._sync_points.family if self._sync_points is not None else None
        return list(family.refusals) if family is not None else []

    @property
    def mode(self):
        """The mode in force on this rank (None before the first fit)."""
        family = self._sync_points.family if self._sync_points is not None else None
        return family.current[0] if family is not None else None


def _validate(mode, options, family):
    if family is not None:
        family.validate(mode, options)
        return

    algorithms.create(mode, **options)
