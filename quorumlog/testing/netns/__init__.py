"""A quorumlog cluster across Linux network namespaces, its nemeses, and a checker in
Jepsen's manner. See docs/TESTING.md, "Clusters across network namespaces".

- :mod:`.network`: namespaces joined by veth pairs to a bridge, links cut and healed;
- :mod:`.proxy`: a TCP proxy in front of each bookie for delay, loss and reordering;
- :mod:`.history`, :mod:`.checker`, :mod:`.linearizability`: histories and their checks.
"""
