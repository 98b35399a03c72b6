"""Planted bugs in the decisions that matter: the list ``run.py`` runs.

Each :class:`Mutant` names one decision, the file it lives in, the exact snippet of today's
code, what it is replaced by (a plausible bug, not a syntax error), and the tests that must
catch it, quickly. When the code moves, the snippet no longer matches: the runner says STALE
and fails, and the entry is brought up to date (the same decision, in its new words) or
removed with the decision it stood for. Snippets must occur exactly once in their file.

Keep each entry's ``tests`` narrow (a file or a few test ids, seconds to a minute): the point
is to know that *these* tests guard *this* decision. A mutant no test catches is a missing
test: write it, then add the test here.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MUTANTS", "Mutant"]


@dataclass(frozen=True)
class Mutant:
    """One planted bug: ``original`` (exactly once in ``file``) becomes ``replacement``; and
    the same for each ``(file, original, replacement)`` of ``also``, for a decision the code
    makes in more than one place (each place alone would be covered by the other)."""

    name: str
    area: str
    decision: str
    file: str
    original: str
    replacement: str
    tests: tuple[str, ...]
    also: tuple[tuple[str, str, str], ...] = ()

    @property
    def edits(self) -> tuple[tuple[str, str, str], ...]:
        """Every ``(file, original, replacement)`` the mutant makes."""
        return ((self.file, self.original, self.replacement), *self.also)


CORE_FRAME_LOOP = "nsq_sansio/_frame_loop.py"
CORE_NEGOTIATION = "nsq_sansio/_negotiation.py"
CORE_SUBSCRIBING = "nsq_sansio/_subscribing.py"
BACKOFF = "nsq_sansio/backoff.py"
RETRY = "nsq_sansio/consumer/retry.py"
LEDGER = "nsq_sansio/consumer/ledger.py"
BACKOFF_CONTROL = "nsq_sansio/consumer/backoff_control.py"
COORDINATOR = "nsq_sansio/consumer/coordinator.py"
DISTRIBUTION = "nsq_sansio/consumer/distribution.py"
ANSWERS = "nsq_sansio/consumer/answers.py"
DRAIN = "nsq_sansio/consumer/drain.py"
PULL = "nsq_sansio/consumer/pull.py"
FETCHES = "nsq_sansio/consumer/fetches.py"
RDY = "nsq_sansio/consumer/rdy.py"

T_CONN = "tests/core/test_connection.py"
T_RDY_BOUND = "tests/core/test_rdy_bound.py"
T_COALESCE = "tests/core/test_coalesce.py"
T_BACKOFF = "tests/consumer/test_backoff_rdy.py"
T_POLICY = "tests/consumer/test_backoff_policy.py"
T_DEAD = "tests/consumer/test_dead_letters.py"
T_FLOW = "tests/consumer/test_coordinator_flow.py"
T_RDY = "tests/consumer/test_coordinator_rdy.py"
T_HELD = "tests/consumer/test_held_bound.py"
T_MESSAGES = "tests/consumer/test_coordinator_messages.py"
T_DRAIN_PULL = "tests/consumer/test_coordinator_drain_pull.py"
T_PULL_AGING = "tests/consumer/test_pull_aging.py"
T_HOT = "tests/consumer/test_coordinator_hot_path.py"
T_STATEFUL = "tests/consumer/test_coordinator_stateful.py"
T_IDENTIFY = "tests/consumer/test_identify_rejected.py"
T_SIM_PROPS = "tests/sim/test_properties.py"
T_KEEPALIVE = "tests/clients/test_keepalive_limit.py"
T_ATTEMPTS = "tests/clients/test_attempts_limit.py"
T_CAUGHT = "tests/mutants/test_caught_decisions.py"
T_SHUTDOWN_DEADLINE = (
    "tests/clients/test_shutdown.py::test_the_drain_deadline_ends_run_and_requeues_at_once"
)

MUTANTS: tuple[Mutant, ...] = (
    # --- RDY bound -------------------------------------------------------------------------
    Mutant(
        "rdy-budget-one-over",
        "RDY bound",
        "the RDY a connection may have is max_in_flight minus what the others may hold",
        LEDGER,
        "        return self.max_in_flight - self.claimed + link.claim\n",
        "        return self.max_in_flight - self.claimed + link.claim + 1\n",
        (T_RDY, T_HELD),
    ),
    Mutant(
        "rdy-ceiling-ignores-held",
        "RDY bound",
        "at settle time the ceiling falls to the RDY or to what is still held, not below",
        LEDGER,
        "            ceiling = max(link.wire_rdy, live)\n",
        "            ceiling = link.wire_rdy\n",
        (T_HELD, T_STATEFUL),
    ),
    Mutant(
        "rdy-not-capped-by-max-rdy-count",
        "RDY bound",
        "a connection's RDY never exceeds nsqd's max_rdy_count",
        LEDGER,
        "        count = max(0, min(count, link.max_rdy))\n",
        "        count = max(0, count)\n",
        (T_RDY,),
        also=(
            (
                DISTRIBUTION,
                "            targets = even_shares(budget, [link.max_rdy if link.warm else 1 "
                "for link in links])\n",
                "            targets = even_shares(budget, [budget if link.warm else 1 "
                "for link in links])\n",
            ),
        ),
    ),
    Mutant(
        "rdy-ceiling-drops-at-once",
        "RDY bound",
        "a lowered RDY keeps its old value as the ceiling until nsqd has read it",
        LEDGER,
        "            if link.rdy >= link.ceiling:\n                link.ceiling = link.rdy\n",
        "            if link.rdy != link.ceiling:\n                link.ceiling = link.rdy\n",
        (T_RDY, T_HELD),
    ),
    Mutant(
        "rdy-expired-answer-frees-a-slot",
        "RDY bound",
        "an answer to a message nsqd may have timed out frees no slot of a lowered RDY",
        LEDGER,
        "        count = sum(map(after.__lt__, deadlines))\n",
        "        count = len(deadlines)\n",
        (T_RDY, T_HELD, T_CAUGHT),
    ),
    Mutant(
        "conn-rdy-refusal-off-by-one",
        "RDY bound",
        "the connection refuses nsqd when more messages are held than the RDY bound",
        CORE_SUBSCRIBING,
        "        if held > self._allowed:\n",
        "        if held > self._allowed + 1:\n",
        (T_RDY_BOUND,),
    ),
    Mutant(
        "conn-rdy-bound-triple",
        "RDY bound",
        "the bound is twice the RDY (nsqd may send a whole RDY again after emptying a channel)",
        CORE_SUBSCRIBING,
        "            self._allowed = 2 * count\n",
        "            self._allowed = 3 * count\n",
        (T_RDY_BOUND,),
    ),
    Mutant(
        "conn-rdy-over-max-rdy-count",
        "RDY bound",
        "RDY outside 0..max_rdy_count is refused locally",
        CORE_SUBSCRIBING,
        "        if not 0 <= count <= limit:\n",
        "        if not 0 <= count <= limit + 1:\n",
        (T_CONN,),
    ),
    Mutant(
        "rdy-refresh-on-every-message",
        "RDY bound",
        "RDY is re-sent when the count left is 0 or under a quarter of the last one",
        RDY,
        "    return last_sent > 0 and (remaining <= 0 or remaining * 4 < last_sent)\n",
        "    return last_sent > 0 and remaining < last_sent\n",
        (T_BACKOFF, T_RDY),
    ),
    Mutant(
        "even-shares-over-budget",
        "RDY bound",
        "even shares never add up to more than the budget",
        RDY,
        "            shares[i] = base + (1 if remainder > 0 else 0)\n",
        "            shares[i] = base + (1 if remainder >= 0 else 0)\n",
        (T_BACKOFF,),
    ),
    # --- backoff ----------------------------------------------------------------------------
    Mutant(
        "backoff-window-uncapped",
        "backoff",
        "a window is multiplier * 2**level, capped at max_backoff_duration",
        BACKOFF,
        "        return min(self._multiplier * 2.0 ** min(level, _MAX_LEVEL_LIMIT), self._max_duration)\n",  # noqa: E501
        "        return self._multiplier * 2.0 ** min(level, _MAX_LEVEL_LIMIT)\n",
        (T_BACKOFF,),
    ),
    Mutant(
        "backoff-window-linear",
        "backoff",
        "windows grow exponentially with the level",
        BACKOFF,
        "        return min(self._multiplier * 2.0 ** min(level, _MAX_LEVEL_LIMIT), self._max_duration)\n",  # noqa: E501
        "        return min(self._multiplier * level, self._max_duration)\n",
        (T_BACKOFF, T_FLOW),
    ),
    Mutant(
        "backoff-level-unbounded",
        "backoff",
        "the level stops rising at max_level",
        BACKOFF,
        "                self._level = min(self._level + 1, self._max_level)\n",
        "                self._level += 1\n",
        (T_BACKOFF,),
    ),
    Mutant(
        "backoff-results-counted-while-waiting",
        "backoff",
        "results during a window never raise the level (they came from messages already in "
        "flight when it opened)",
        BACKOFF,
        "        if self._phase is BackoffPhase.WAITING:\n"
        "            return self._in_window(outcome, failed)\n",
        "",
        (T_BACKOFF,),
    ),
    Mutant(
        "backoff-window-success-ignores-its-failures",
        "backoff",
        "a success during a window lowers the level only once the window's successes "
        "outnumber its failures",
        BACKOFF,
        "        if self._balance <= 0:\n            return False\n",
        "",
        (T_BACKOFF, T_POLICY),
    ),
    Mutant(
        "backoff-success-resets-level",
        "backoff",
        "a success lowers the level by one, not to zero",
        BACKOFF,
        "            self._level -= 1\n",
        "            self._level = 0\n",
        (T_BACKOFF, T_FLOW),
    ),
    Mutant(
        "backoff-testing-full-rdy",
        "backoff",
        "after a window, the test lets in one message more than the consumer holds, not "
        "max_in_flight",
        BACKOFF,
        "        return min(self._allowance, max_in_flight)\n",
        "        return max_in_flight\n",
        (T_BACKOFF, T_FLOW),
    ),
    Mutant(
        "backoff-test-ignores-held",
        "backoff",
        "the test's allowance counts the messages handlers still hold (RDY 1 beside running "
        "handlers lets no test message in)",
        BACKOFF,
        "            self._allowance = held + 1\n",
        "            self._allowance = 1\n",
        (T_BACKOFF, T_POLICY),
    ),
    Mutant(
        "backoff-test-waits-on-taken-back",
        "backoff",
        "a test with nothing held still in flight on nsqd (hung handlers, their messages taken "
        "back) lets one message in: no result can come of those",
        BACKOFF_CONTROL,
        "        return max(new, 1) if in_flight == 0 else new\n",
        "        return new\n",
        (T_POLICY + "::test_a_hung_handler_never_keeps_the_test_message_out",),
    ),
    Mutant(
        "backoff-test-rdy-never-moves",
        "backoff",
        "while the test lets fewer messages in than there are connections, its RDY moves off "
        "an idle holder (an nsqd with nothing to send)",
        DISTRIBUTION,
        "            scarce = self._testing_room(links, live) < len(links)\n",
        "            scarce = self._budget() < len(links)\n",
        (T_POLICY + "::test_the_test_message_rdy_moves_off_an_nsqd_with_nothing_to_send",),
    ),
    Mutant(
        "backoff-success-while-testing-opens-window",
        "backoff",
        "a success while testing above level 0 widens the test (two more in), no new window",
        BACKOFF,
        "            else:  # testing: the freed slot, and one more\n"
        "                self._allowance += 1\n",
        "            else:  # testing: the freed slot, and one more\n"
        "                self._open_window(now, balance=0)\n",
        (T_BACKOFF, T_POLICY),
    ),
    Mutant(
        "backoff-repeated-failure-raises-level",
        "backoff",
        "a repeated failure (attempts > 1) opens a window without raising the level",
        BACKOFF,
        "            if outcome is Outcome.FAILURE or self._level == 0:\n",
        "            if True:\n",
        (T_BACKOFF, T_POLICY),
    ),
    Mutant(
        "backoff-neutral-while-testing-ignored",
        "backoff",
        "a neutral result while testing opens another window at the same level",
        BACKOFF,
        "        self._open_window(now, balance=0)  # neutral while testing: nothing learned, wait again\n",  # noqa: E501
        "",
        (T_BACKOFF,),
    ),
    Mutant(
        "backoff-requeue-flag-ignored",
        "backoff",
        "requeue(backoff=False) does not slow the consumer down",
        ANSWERS,
        "        if not (backoff and self._config.backoff_active):\n",
        "        if not self._config.backoff_active:\n",
        (T_FLOW,),
    ),
    Mutant(
        "backoff-req-before-rdy0",
        "backoff",
        "a REQ that starts backoff goes out after RDY 0 (else nsqd hands it straight back)",
        ANSWERS,
        "            self._rdy.backoff_moved(now)\n            self._ledger.emit(link)\n"
        "            link.proto.requeue(message_id, delay)\n",
        "            self._rdy.backoff_moved(now)\n"
        "            link.proto.requeue(message_id, delay)\n",
        (T_FLOW,),
    ),
    Mutant(
        "reconnect-delay-not-exponential",
        "backoff",
        "direct reconnects back off exponentially, capped",
        BACKOFF,
        "    delay = min(base * 2.0**exponent, cap)\n",
        "    delay = min(base, cap)\n",
        (T_BACKOFF, T_FLOW),
    ),
    # --- attempts ---------------------------------------------------------------------------
    Mutant(
        "attempts-over-ge",
        "attempts",
        "a message is given up after more than max_attempts deliveries, not at max_attempts",
        RETRY,
        "    return bool(max_attempts) and attempts > max_attempts\n",
        "    return bool(max_attempts) and attempts >= max_attempts\n",
        (T_MESSAGES, T_ATTEMPTS),
    ),
    Mutant(
        "attempts-zero-not-unlimited",
        "attempts",
        "max_attempts 0 means no limit",
        RETRY,
        "    return bool(max_attempts) and attempts > max_attempts\n",
        "    return attempts > max_attempts\n",
        (T_MESSAGES, T_ATTEMPTS),
    ),
    Mutant(
        "attempts-hot-path-one-over",
        "attempts",
        "the read path's inlined give-up test (a read of messages only)",
        COORDINATOR,
        "            not max_attempts or max(map(_attempts, deliveries)) <= max_attempts\n",
        "            not max_attempts or max(map(_attempts, deliveries)) <= max_attempts + 1\n",
        (T_MESSAGES, T_HOT),
    ),
    Mutant(
        "attempts-mixed-read-one-over",
        "attempts",
        "the read path's inlined give-up test (a read mixing messages and other frames)",
        COORDINATOR,
        "                if event[DELIVER_ATTEMPTS] > attempts_limit:\n",
        "                if event[DELIVER_ATTEMPTS] > attempts_limit + 1:\n",
        (T_MESSAGES, T_HOT, T_STATEFUL),
    ),
    Mutant(
        "attempts-pull-path-one-over",
        "attempts",
        "pull mode's inlined give-up test",
        COORDINATOR,
        "                and (not self._max_attempts or max(map(_attempts, events)) <= self._max_attempts)\n",  # noqa: E501
        "                and (not self._max_attempts or max(map(_attempts, events)) <= self._max_attempts + 1)\n",  # noqa: E501
        (T_MESSAGES, T_DRAIN_PULL, T_ATTEMPTS),
    ),
    Mutant(
        "attempts-give-up-requeues",
        "attempts",
        "a message over max_attempts is FIN'd (and reported), never requeued again",
        ANSWERS,
        "            proto.finish(message_id)\n            self.given_up += 1\n",
        "            proto.requeue(message_id, 0.0)\n            self.given_up += 1\n",
        (T_MESSAGES,),
    ),
    Mutant(
        "attempts-give-up-neutral-for-backoff",
        "attempts",
        "a give-up (FIN'd) counts as a success for backoff, as in go-nsq and pynsq",
        ANSWERS,
        "            if self._backoff.record(Outcome.SUCCESS, now):  # a give-up FINs: a success\n",
        "            if self._backoff.record(Outcome.NEUTRAL, now):  # a give-up FINs: a success\n",
        (T_POLICY,),
    ),
    Mutant(
        "dead-letter-fin-before-publish",
        "attempts",
        "a dead-lettered message is held until the publish is reported, FIN'd only after it",
        ANSWERS,
        "                link.tracked[message_id] = delivery\n"
        "                if self.explicit_delivery:  # a drain must wait for it, not requeue it\n",
        "                proto.finish(message_id)\n"
        "                if self.explicit_delivery:  # a drain must wait for it, not requeue it\n",
        (T_DEAD,),
    ),
    Mutant(
        "dead-letter-failure-fins",
        "attempts",
        "a dead letter whose publish failed is requeued (delivered and dead-lettered again), "
        "not FIN'd",
        ANSWERS,
        "        return self.requeue(delivery, now, backoff=False)\n",
        "        return self.finish(delivery, now)\n",
        (T_DEAD,),
    ),
    Mutant(
        "dead-letter-give-up-neutral-for-backoff",
        "backoff",
        "a dead-lettered give-up is a success for backoff, as a plain give-up is",
        ANSWERS,
        "        # FIN'd after a give-up: a success for backoff, as a give-up without dead letters "
        "is\n        self.after_answer(link, Outcome.SUCCESS, now, delivery)\n",
        "        # FIN'd after a give-up: a success for backoff, as a give-up without dead letters "
        "is\n        self.after_answer(link, Outcome.NEUTRAL, now, delivery)\n",
        (T_DEAD,),
    ),
    Mutant(
        "requeue-delay-flat",
        "attempts",
        "the automatic REQ delay grows with the attempts",
        RETRY,
        "    delay = min(config.default_requeue_delay * max(attempts, 1), config.max_requeue_delay)\n",  # noqa: E501
        "    delay = min(config.default_requeue_delay, config.max_requeue_delay)\n",
        (T_MESSAGES,),
    ),
    # --- drain ------------------------------------------------------------------------------
    Mutant(
        "drain-keeps-rdy",
        "drain",
        "drain sets RDY 0 everywhere before any REQ",
        DRAIN,
        "            if link.rdy:\n                self._ledger.send(link, 0, now)"
        "  # before any REQ: nsqd must not resend them\n",
        "            pass\n",
        (T_DRAIN_PULL,),
    ),
    Mutant(
        "drain-unseen-kept",
        "drain",
        "what the user never saw is requeued at once when the drain starts",
        DRAIN,
        "            if found is not None:\n                self._requeue_now(found, delivery)\n",
        "            if found is not None:\n                pass\n",
        (T_DRAIN_PULL,),
    ),
    Mutant(
        "drain-deadline-keeps-held",
        "drain",
        "at the drain deadline what the user still holds is requeued (and reported)",
        DRAIN,
        "                    held.append(delivery)\n                    self._requeue_now(link, delivery)\n",  # noqa: E501
        "                    held.append(delivery)\n",
        (T_DRAIN_PULL,),
    ),
    Mutant(
        "drain-deadline-blocking-handler-fins-late",
        "drain",
        "at the drain deadline a blocking run() handler's message is requeued and marked "
        "answered: the handler's thread runs on, and what it answers when it returns is not sent",
        "transports/sync/_consumer_io.py",
        "            if thread is not None:\n                message.answered = True\n",
        "            if thread is not None:\n                pass\n",
        ("tests/sync/test_signals.py",),
    ),
    Mutant(
        "drain-deadline-anyio-handler-unanswered",
        "drain",
        "at the drain deadline an asyncio/trio run() handler is cancelled and its message, "
        "requeued by the drain, is marked answered (nothing is sent for it afterwards)",
        "transports/anyio/consumer.py",
        "        if message.answered:\n            return\n        message.answered = True\n",
        "        if message.answered:\n            return\n",
        (T_SHUTDOWN_DEADLINE,),
    ),
    Mutant(
        "drain-cls-while-held",
        "drain",
        "CLS is sent on a connection only when nothing is held on it",
        DRAIN,
        "        if link.phase is LinkPhase.SUBSCRIBED and not link.tracked:\n",
        "        if link.phase is LinkPhase.SUBSCRIBED:\n",
        (T_DRAIN_PULL,),
    ),
    Mutant(
        "drain-cls-never-cut",
        "drain",
        "a server that never answers CLS is cut CLOSE_WAIT_GRACE after the drain deadline",
        DRAIN,
        "            link.close_deadline = max(base, now) + CLOSE_WAIT_GRACE\n",
        "            link.close_deadline = None\n",
        (T_DRAIN_PULL,),
    ),
    Mutant(
        "drain-delivers-late-messages",
        "drain",
        "a message arriving while draining goes back at once (REQ 0), not to the user",
        ANSWERS,
        "        if not link.accepting:\n            self._ledger.emit(link)  # RDY 0 goes before the REQ\n",  # noqa: E501
        "        if False:\n            self._ledger.emit(link)  # RDY 0 goes before the REQ\n",
        (T_DRAIN_PULL,),
    ),
    Mutant(
        "drain-req-before-rdy0",
        "drain",
        "drain's RDY 0 is written before its REQs",
        ANSWERS,
        "            self._ledger.emit(link)  # drain's RDY 0 goes before the REQ\n",
        "",
        (T_DRAIN_PULL,),
    ),
    # --- keepalive --------------------------------------------------------------------------
    Mutant(
        "touch-at-deadline",
        "keepalive",
        "TOUCH half-way to the deadline, not at it",
        ANSWERS,
        "        return deadline - link.msg_timeout / 2\n",
        "        return deadline\n",
        (T_MESSAGES,),
    ),
    Mutant(
        "touch-past-max-msg-timeout",
        "keepalive",
        "no TOUCH once the deadline reached max_msg_timeout",
        ANSWERS,
        "        if deadline >= delivery.received_at + link.max_msg_timeout:\n            return None\n",  # noqa: E501
        "",
        (T_MESSAGES, T_KEEPALIVE),
    ),
    Mutant(
        "touch-deadline-uncapped",
        "keepalive",
        "TOUCH never pushes the deadline past received + max_msg_timeout",
        ANSWERS,
        "        deadline = min(now + link.msg_timeout, delivery.received_at + link.max_msg_timeout)\n",  # noqa: E501
        "        deadline = now + link.msg_timeout\n",
        (T_MESSAGES,),
    ),
    Mutant(
        "anyio-keepalive-keeps-touching",
        "keepalive",
        "the anyio keepalive says KeepaliveExpired once and stops touching at the limit",
        "transports/anyio/message.py",
        "                        consumer._emit(event)\n                    return\n",
        "                        consumer._emit(event)\n"
        "                    touch_at = monotonic() + 0.01\n",
        (T_KEEPALIVE,),
    ),
    # --- FIN once ---------------------------------------------------------------------------
    Mutant(
        "conn-fin-twice",
        "FIN once",
        "a message is FIN'd at most once (a second answer is refused locally)",
        CORE_SUBSCRIBING,
        "            self._in_flight.remove(message_id)  # only ever filled in SUBSCRIBED or CLOSING\n",  # noqa: E501
        "            self._in_flight.discard(message_id)  # only ever filled in SUBSCRIBED or CLOSING\n",  # noqa: E501
        (T_CONN,),
    ),
    Mutant(
        "conn-finish-many-repeated-id",
        "FIN once",
        "finish_many with an id twice sends nothing and raises",
        CORE_SUBSCRIBING,
        "                if before - len(in_flight) == len(message_ids):\n",
        "                if True:\n",
        (T_CONN,),
    ),
    Mutant(
        "fin-of-stale-copy-forgets-new",
        "FIN once",
        "a FIN of an old copy keeps the newer delivery of that id tracked",
        COORDINATOR,
        "            link.head = head\n"
        "        else:\n"
        "            tracked = link.tracked\n"
        "            current = tracked.pop(message_id, None)\n"
        "            if current is not delivery:  # answered, taken back, or delivered again\n"
        "                if current is not None:  # a newer delivery of that id: keep it\n"
        "                    tracked[message_id] = current\n",
        "            link.head = head\n"
        "        else:\n"
        "            tracked = link.tracked\n"
        "            current = tracked.pop(message_id, None)\n"
        "            if current is not delivery:  # answered, taken back, or delivered again\n",
        (T_MESSAGES, T_HOT),
    ),
    Mutant(
        "anyio-finish-twice",
        "FIN once",
        "a second finish() of a message returns False and sends nothing",
        "transports/anyio/message.py",
        '        """FIN without awaiting (it is queued and written with the next batch)."""\n'
        "        if self.answered:\n            return False\n",
        '        """FIN without awaiting (it is queued and written with the next batch)."""\n',
        ("tests/clients/test_parity.py::test_answers_return_the_same_on_every_runtime",),
    ),
    # --- coalescing refusal -----------------------------------------------------------------
    Mutant(
        "coalesced-refusal-blames-every-member",
        "coalescing refusal",
        "a refused coalesced MPUB fails no member by itself: each is resent alone",
        CORE_FRAME_LOOP,
        "                refused = CoalescedPublishRefused(error)\n",
        "                refused = error\n",
        (T_COALESCE, "tests/clients/test_producer_guarantees.py"),
    ),
    Mutant(
        "sync-refused-group-head-pays",
        "coalescing refusal",
        "the blocking producer resends each member of a refused group alone",
        "transports/sync/_producer_io.py",
        "                    log_coalesced_refused(node.log, request.topic, error.error)\n"
        "                request.alone = True\n",
        "                    log_coalesced_refused(node.log, request.topic, error.error)\n"
        "                    inflight.pop(event.request_id, None)\n"
        "                    self._fail_request(request, error.error)\n"
        "                    return\n"
        "                request.alone = True\n",
        (
            "tests/sync/test_producer_direct.py::test_answers_reach_their_callers_under_many_threads_embedded",
        ),
    ),
    Mutant(
        "anyio-refused-group-fails-members",
        "coalescing refusal",
        "the anyio producer resends each member of a refused group alone",
        "transports/anyio/_producer_io.py",
        "                    self._resolve(call, send_alone)\n",
        "                    self._resolve(call, error.error)\n",
        ("tests/clients/test_producer_guarantees.py", "tests/aio/test_roundtrip.py"),
    ),
    # --- upgrade byte -----------------------------------------------------------------------
    Mutant(
        "tls-upgrade-drops-trailing-bytes",
        "upgrade byte",
        "bytes after the IDENTIFY answer in the same read belong to the TLS handshake",
        CORE_FRAME_LOOP,
        "            events.append(TLSUpgradeRequired(trailing))\n",
        '            events.append(TLSUpgradeRequired(b""))\n',
        (T_CONN,),
    ),
    Mutant(
        "compression-trailing-read-plain",
        "upgrade byte",
        "bytes after the switch to compression are decompressed",
        CORE_FRAME_LOOP,
        "        elif trailing:\n            self._decompress_and_process(trailing, events)\n",
        "        elif trailing:\n            self._process(trailing, events)\n",
        (T_CONN,),
    ),
    Mutant(
        "upgrade-decodes-past-the-switch",
        "upgrade byte",
        "decoding stops at exactly the byte where nsqd switches (TLS or compression)",
        CORE_FRAME_LOOP,
        "                if self._switch or self._state is _S.CLOSED:\n                    break\n",
        "                if self._state is _S.CLOSED:\n                    break\n",
        (T_CONN,),
    ),
    Mutant(
        "compression-compresses-queued-output",
        "upgrade byte",
        "what was queued before the switch goes out uncompressed",
        CORE_NEGOTIATION,
        '        self._out_plain += b"".join(self._out)\n        self._out.clear()\n',
        "",
        (T_CONN, T_CAUGHT),
    ),
    # --- other critical decisions -----------------------------------------------------------
    Mutant(
        "heartbeat-unanswered",
        "heartbeat",
        "a heartbeat is answered with NOP by the core",
        CORE_FRAME_LOOP,
        '            self._count_unsolicited("heartbeats")\n            self._out.append(b"NOP\\n")\n',  # noqa: E501
        '            self._count_unsolicited("heartbeats")\n',
        (T_CONN,),
    ),
    Mutant(
        "identify-refusal-retried",
        "IDENTIFY refusal",
        "a refused IDENTIFY is IdentifyRejected (the configuration's fault: fail, not retry)",
        CORE_FRAME_LOOP,
        "                self._fail(IdentifyRejected(error), events)\n",
        "                self._fail(error, events)\n",
        (T_CONN, T_IDENTIFY),
    ),
    Mutant(
        "late-answer-errors-fatal",
        "late answers",
        "E_FIN_FAILED / E_REQ_FAILED / E_TOUCH_FAILED are not fatal",
        CORE_FRAME_LOOP,
        "        command = _NON_FATAL_COMMANDS.get(error.code)\n        if command is not None:\n",
        "        command = _NON_FATAL_COMMANDS.get(error.code)\n        if False:\n",
        (T_CONN, T_MESSAGES),
    ),
    Mutant(
        "fetch-expires-ignored",
        "pull",
        "a fetch with expires answers with what arrived when it expires",
        PULL,
        "        request = FetchRequest(request_id, batch, None if expires is None else now + expires)\n",  # noqa: E501
        "        request = FetchRequest(request_id, batch, None)\n",
        (T_DRAIN_PULL,),
    ),
    Mutant(
        "fetch-ages-at-the-deadline",
        "pull",
        "a waiting fetch answers once its oldest message used half its msg_timeout",
        FETCHES,
        "    return delivery.received_at + (delivery.deadline - delivery.received_at) / 2\n",
        "    return delivery.deadline\n",
        (T_PULL_AGING,),
    ),
    Mutant(
        "pull-rdy-beyond-asked",
        "pull",
        "pull mode's RDY is what the fetches asked for, never more",
        PULL,
        "        wanted = max(0, min(self.fetches.outstanding, budget - sum(live)))\n",
        "        wanted = max(0, budget - sum(live))\n",
        (T_DRAIN_PULL,),
    ),
)
