"""Everything of nsq-sansio that touches sockets, clocks, threads or signals."""
