"""The journal: every change a bookie acknowledges is first appended here and synced (R2).

One module each for its parts:

- :mod:`.format`: files, records and manifests, as they lie on disk;
- :mod:`.writer`: the :class:`~.writer.Journal`, group commit on its own thread;
- :mod:`.direct_io`: writing batches around the page cache;
- :mod:`.replay`: reading the journal back at start (:func:`~.replay.scan`), and
  what damage means there.
"""
