"""A quorumlog cluster across Linux network namespaces, its nemeses, and a checker in
Jepsen's manner (as root). See docs/TESTING.md, "Clusters across network namespaces".

- :mod:`.network`: namespaces joined by veth pairs to a bridge in a namespace of the
  run's own, on 10.213.0.0/24; links cut one way or both, and healed;
- :mod:`.zookeeper`: ZooKeeper servers (an ensemble) in namespaces;
- :mod:`.proxy`: the TCP proxy in front of each bookie for delay, loss and reordering;
- :mod:`.cluster`: :class:`~.cluster.NetnsCluster`, bookies, database replicas and
  clients, one namespace each;
- :mod:`.nemesis`: the faults, each started, held and healed;
- :mod:`.workload`: the client processes, each recording its history;
- :mod:`.history`, :mod:`.checker`, :mod:`.linearizability`: histories and their
  checks (pure);
- :mod:`.runner`: one nemesis run, and the suite (``python -m tests.harness.netns``).

Example::

    from tests.harness.netns.cluster import NetnsCluster
    from tests.harness.netns.runner import SUITE, run_nemesis

    with NetnsCluster("zk", base_dir=out / "cluster") as cluster:
        cluster.start()
        result = run_nemesis(cluster, SUITE["partition-bookie"], out / "runs")
        assert result.valid, result.summary_line()
"""
