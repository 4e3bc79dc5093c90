"""Everything that runs across processes, ranks or nodes: the simulator fleet and its cluster helpers (`sim/`), the
exact weight sync and its update groups (`sync/`), the ZeRO-3 actor (`actor/`). Imports nothing itself, so a
simulator process that imports `parallel.sim` imports no torch."""
