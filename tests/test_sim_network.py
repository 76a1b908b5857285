"""Links: a port kept as its reservation behaves as a capacity-1 FIFO SimPy Resource, and
collectives wait for every member."""
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from parsim.sim.network import Communicator, Port, collective, group_link, link_between, reserve_all
from parsim.specs import load_cluster

transfers = st.lists(st.tuples(st.floats(0, 10, allow_nan=False), st.floats(0, 3, allow_nan=False),
                               st.sampled_from([0, 1, 2])), min_size=1, max_size=40)


def _with_resources(requests):
    """Start times of each transfer on real capacity-1 Resources; a request with ``ports``
    asks for all of them at one instant (as a collective does)."""
    env = simpy.Environment()
    links = [simpy.Resource(env, capacity=1) for _ in range(3)]
    starts = {}

    def transfer(i, at, duration, ports):
        yield env.timeout(at)
        reqs = [links[p].request() for p in ports]
        yield env.all_of(reqs)
        starts[i] = env.now
        yield env.timeout(duration)
        for p, r in zip(ports, reqs):
            links[p].release(r)

    for i, (at, duration, ports) in enumerate(requests):
        env.process(transfer(i, at, duration, ports))
    env.run()
    return starts


def _with_reservations(requests):
    ports = [Port(str(i)) for i in range(3)]
    order = sorted(range(len(requests)), key=lambda i: (requests[i][0], i))
    return {i: reserve_all([ports[p] for p in requests[i][2]], requests[i][0], requests[i][1]) for i in order}


@settings(max_examples=200, deadline=None)
@given(transfers)
def test_a_reserved_port_starts_transfers_when_a_fifo_resource_would(items):
    requests = [(at, duration, [port]) for at, duration, port in items]
    assert _with_reservations(requests) == _with_resources(requests)


@settings(max_examples=200, deadline=None)
@given(transfers, st.lists(st.sampled_from([(0, 1), (1, 2), (0, 2), (0, 1, 2)]), min_size=40, max_size=40))
def test_a_transfer_over_several_ports_starts_when_all_are_free(items, groups):
    requests = [(at, duration, list(groups[i]) if port == 0 else [port]) for i, (at, duration, port) in enumerate(items)]
    assert _with_reservations(requests) == _with_resources(requests)


def test_a_collective_starts_when_its_last_member_arrives():
    env = simpy.Environment()
    ports = (Port("nic"), Port("nic"), Port("nic"))
    comm = Communicator("dp", (0, 1, 2), (0, 1, 2), ports, "nic")
    ends = {}

    def member(rank, arrive):
        yield env.timeout(arrive)
        start = yield from collective(env, comm, rank, 2.0)
        ends[rank] = (start, env.now)

    for rank, arrive in ((0, 1.0), (1, 5.0), (2, 3.0)):
        env.process(member(rank, arrive))
    env.run()
    assert ends == {0: (5.0, 7.0), 1: (5.0, 7.0), 2: (5.0, 7.0)}


def test_traffic_inside_a_node_takes_nvlink_and_across_nodes_the_nic():
    cluster = load_cluster("a100-80g:32")
    assert link_between(cluster, 0, 7) == "nvlink"
    assert link_between(cluster, 7, 8) == "nic"
    assert group_link(cluster, list(range(8))) == "nvlink"
    assert group_link(cluster, [0, 8, 16, 24]) == "nic"
