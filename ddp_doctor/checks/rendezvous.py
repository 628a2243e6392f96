"""Catalogue entries for what the bounded rendezvous observes (DDP310-DDP329; DDP846, two jobs at one store)."""
from __future__ import annotations

from ddp_doctor.registry import declare

SG_HINT = ("If the ranks are on different hosts, check that the network lets them talk: on AWS the "
           "security group needs a self-referencing rule allowing all traffic inbound AND outbound "
           "(SageMaker's documented requirement for multi-node jobs; EFA needs both directions).")

MASTER_UNRESOLVABLE = declare(
    "DDP310", category="network", severity="error", title="MASTER_ADDR does not resolve",
    doc="""
    What: The host name in MASTER_ADDR could not be resolved to an address on this rank.
    Why: Every rank connects to the rendezvous store on MASTER_ADDR:MASTER_PORT; a name that does
    not resolve fails at once or, with some resolvers, hangs until torch's 30-minute timeout.
    Fix: Set MASTER_ADDR to a name every node can resolve (or an IP address). On SageMaker use the
    master host the toolkit picks (SM_TRAINING_ENV master_hostname), never a hard-coded algo-1.
    """)

MASTER_REFUSED = declare(
    "DDP311", category="network", severity="error", title="Rendezvous master refuses connections",
    doc="""
    What: MASTER_ADDR:MASTER_PORT answered, but nothing listened on the port for the whole bound.
    Why: The rank that should host the store (rank 0, or torchrun's agent on the master node) is
    not running, crashed, or listens on another port or host.
    Fix: Start rank 0 / the master node's launcher, and give every node the same --master-addr and
    --master-port; check that MASTER_ADDR names the host where rank 0 runs.
    """)

MASTER_TIMEOUT = declare(
    "DDP312", category="network", severity="error", title="Rendezvous master unreachable (timeout)",
    doc=f"""
    What: Connecting to MASTER_ADDR:MASTER_PORT timed out (no answer at all) for the whole bound.
    Why: Packets to the master are dropped: a firewall or security group blocks the port, or the
    address routes nowhere. Left alone, torch waits 30 minutes before failing.
    Fix: {SG_HINT}
    """)

PORT_IN_USE = declare(
    "DDP313", category="network", severity="error", title="MASTER_PORT already in use",
    doc="""
    What: The process that hosts the rendezvous store (rank 0, or under `ddp-doctor run` the
    launcher on node 0) could not listen on MASTER_PORT because another process holds it; the
    finding names that process (pid and command line) when this host lets it be seen.
    Why: torch fails with "Address already in use" (EADDRINUSE, errno 98: often a previous job, a
    hung test or a dev server that still holds the port); no rank starts, and the other nodes
    wait for a master that never comes. No node is missing: this node could not host the meeting.
    Fix: Stop the process holding the port (`ss -ltnp 'sport = :PORT'`), or choose a free
    MASTER_PORT (torchrun --master-port, the same on every node), or for a single-node job leave
    --master-port out (`ddp-doctor run` then passes --standalone, which picks a free port).
    """)

MASTER_NOT_LOCAL = declare(
    "DDP314", category="network", severity="error", title="Rank 0 does not run on MASTER_ADDR",
    doc="""
    What: Rank 0 hosts the rendezvous store, but MASTER_ADDR resolves to no address of rank 0's host.
    Why: The other ranks connect to MASTER_ADDR and find no store there: they hang or are refused.
    Fix: Set MASTER_ADDR to the host where rank 0 runs (under mpirun: the first host of the host list).
    """)

NOT_A_STORE = declare(
    "DDP315", category="network", severity="error", title="MASTER_PORT answers, but not as a torch store",
    doc="""
    What: MASTER_ADDR:MASTER_PORT accepts connections, but torch's store handshake fails or gets no
    answer there; the finding quotes what the peer sent (a banner, an HTTP reply) or that it
    stayed silent.
    Why: Another service holds the port on the master host (a web server, a notebook, a leftover
    process that accepts and never answers), so rank 0 could not host the store there (its own
    report says DDP313, MASTER_PORT already in use). Left alone, torch's store client waits for an
    answer without any timeout: the rank hangs forever.
    Fix: Give every rank a free MASTER_PORT (torchrun --master-port, the same on every node), or
    stop the service that holds it (`ss -ltnp 'sport = :PORT'` on the master host).
    """)

RANKS_MISSING = declare(
    "DDP320", category="network", severity="error", title="Ranks missing at rendezvous",
    doc="""
    What: Not every rank of WORLD_SIZE checked in at the rendezvous store within the bound; the
    finding names the ranks that arrived and those that did not.
    Why: WORLD_SIZE is larger than the ranks launched (a node not started, --nnodes or
    --nproc-per-node wrong on one node), or the missing ranks cannot reach the master.
    Fix: Make WORLD_SIZE equal the ranks you launch (nodes x processes per node), start every node,
    and read the missing ranks' own reports for why they could not connect.
    """)

PG_INIT_FAILED = declare(
    "DDP321", category="communication", severity="error", title="init_process_group failed",
    doc="""
    What: Every rank reached the store, but creating the process group failed or timed out.
    Why: The backend could not connect the ranks to each other (ports between the nodes blocked,
    a wrong network interface), or the backend is broken on this machine.
    Fix: Check NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME and the network between the nodes; run with
    NCCL_DEBUG=INFO to see which connection fails.
    """)

DUPLICATE_RANK = declare(
    "DDP322", category="launcher_env", severity="error", title="Two processes claim the same rank",
    doc="""
    What: More than one process checked in at the rendezvous with the same RANK. A later claimant
    says which process holds the rank (its host and pid) and how many claimed it.
    Why: The launcher gave two processes the same RANK (a node started twice, NODE_RANK repeated,
    a hand-written launch script with a fixed RANK), so another rank is missing and the job hangs.
    Fix: Give every node a distinct --node-rank and let the launcher set RANK.
    """)

STORE_LOST = declare(
    "DDP323", category="network", severity="error", title="Lost the rendezvous store",
    doc="""
    What: The rendezvous store stopped answering while the ranks were exchanging their views.
    Why: The process hosting it (rank 0 or torchrun's agent) died or its host became unreachable.
    Fix: Read the hosting rank's report and stderr; it holds the first failure.
    """)

REPORTER_LOST = declare(
    "DDP324", category="network", severity="error", title="No verdict from the reporting rank",
    doc="""
    What: This rank handed its findings over but never received the merged verdict.
    Why: The reporting rank (rank 0) died or hung while merging; this rank wrote its own report.
    Fix: Read rank 0's stderr and the per-rank report files (PATH.rankN.json).
    """)

VIEW_UNREADABLE = declare(
    "DDP325", category="consistency", severity="error", title="A rank's view could not be read",
    doc="""
    What: A rank checked in at the rendezvous, but what it put in the store is not a view the
    reporting rank's ddp-doctor can read, so the checks across ranks left that rank out.
    Why: The ranks run different ddp-doctor versions (the way a rank's view is put in the store
    changed between versions; a node with an older install or image), or another program wrote
    under ddp-doctor's keys in the store.
    Fix: Install one ddp-doctor version on every node (`pip show ddp-doctor` on each, or one image
    for all), then run the preflight again.
    """)

PLANS_DIFFER = declare(
    "DDP326", category="consistency", severity="error", title="The ranks would run different group checks",
    doc="""
    What: Before the checks that run collectives (bandwidth, correctness, clocks), every rank sends
    the others a digest of its ddp-doctor version and the group checks it would run, in their
    order (one all_gather, bounded by the preflight's timeout). When the digests differ, or the
    exchange itself fails, no group check runs: the finding lists the ranks of each plan, and
    each plan (its checks and its ddp-doctor version) is in the finding's evidence, by rank. A
    failed exchange is a consequence of what failed first (a rank whose process group failed).
    Why: The group checks are collectives: every rank must call them in the same order, or one
    rank's check waits for a collective that another rank never calls until the timeout (and then
    reads as a crashed check). Ranks plan differently when their nodes have different ddp-doctor
    versions (an older install or image on one node) or were given different --select / --skip.
    Fix: Install one ddp-doctor version on every node (`pip show ddp-doctor` on each, or one image
    for all) and give every rank the same --select / --skip, then run the preflight again.
    """)

SHARED_RENDEZVOUS = declare(
    "DDP846", category="launcher_env", severity="error",
    title="Two jobs share one rendezvous (MASTER_ADDR:MASTER_PORT)",
    doc="""
    What: More processes met at the rendezvous store than its world has ranks: a rank claimed by
    two processes, the ranks of a larger world (another job's, from rank WORLD_SIZE on), or a
    rank 0 that could not host the store because another job's rendezvous holds MASTER_PORT.
    The finding names every process it saw (rank, pid, host) and how many checked in for
    WORLD_SIZE.
    Why: Two jobs (or one job started twice) were given the same MASTER_ADDR and MASTER_PORT, as
    hand-written launch scripts with a fixed port do. Their processes meet in one store and form
    one group from parts of both: a job could train with another job's ranks while its own wait
    or fail. Every process that met there fails its preflight instead, so neither job reports a
    pass.
    Fix: Give each job its own MASTER_PORT (a free one: `torchrun --standalone` picks one for a
    one-node job; otherwise the same --master-port on every node of that job, and another for the
    next job), start each rank once, and end the extra processes the finding names.
    """)
