// nostr-tools' everyday pattern against the relay: subscribe to an event
// by its id, then publish it (and the other order), as a client does to
// see its own event come back. Each check prints ok or FAILED; the first
// failure ends the script with exit status 1.
//
//   node ids.mjs ws://127.0.0.1:PORT/

import assert from 'node:assert/strict'
import WebSocket from 'ws'
import { finalizeEvent, generateSecretKey } from 'nostr-tools/pure'
import { Relay, useWebSocketImplementation } from 'nostr-tools/relay'
import { runChecks } from './checks.mjs'

useWebSocketImplementation(WebSocket)

const url = process.argv[2]
assert.ok(url && url.startsWith('ws'), 'usage: node ids.mjs ws://host:port/')
const WAIT_MS = 10_000

const sk = generateSecretKey()
const note = content =>
  finalizeEvent({ kind: 1, created_at: Math.floor(Date.now() / 1000), tags: [], content }, sk)

/**
 * Subscribes to `filters` and records what arrives; `seen(id)` resolves
 * when that event arrives and rejects when the subscription is closed
 * before it, or after WAIT_MS.
 */
function watch(relay, filters) {
  const events = []
  let eose
  const eosed = new Promise(r => (eose = r))
  let closedWhy = null
  const waiters = []
  const settle = () => {
    for (const w of waiters.splice(0)) {
      if (events.some(e => e.id === w.id)) w.ok()
      else if (closedWhy !== null) w.fail(new Error(`closed before ${w.id}: "${closedWhy}"`))
      else waiters.push(w)
    }
  }
  const sub = relay.subscribe(filters, {
    onevent: e => {
      events.push(e)
      settle()
    },
    oneose: () => eose(),
    onclose: why => {
      closedWhy = why
      settle()
    },
  })
  const seen = id =>
    new Promise((ok, fail) => {
      const timer = setTimeout(() => fail(new Error(`${id} not received within ${WAIT_MS} ms`)), WAIT_MS)
      waiters.push({ id, ok: () => (clearTimeout(timer), ok()), fail: e => (clearTimeout(timer), fail(e)) })
      settle()
    })
  return { sub, events, eosed, seen, closed: () => closedWhy }
}

const relay = await Relay.connect(url)

const checks = [
  ['subscribe by id, then publish: the event arrives live', async () => {
    const ev = note('subscribed first')
    const w = watch(relay, [{ ids: [ev.id] }])
    await w.eosed
    await relay.publish(ev)
    await w.seen(ev.id)
    assert.equal(w.events.length, 1)
    w.sub.close()
  }],
  ['publish, then subscribe by id: the stored event arrives', async () => {
    const ev = note('published first')
    await relay.publish(ev)
    const w = watch(relay, [{ ids: [ev.id] }])
    await w.seen(ev.id)
    await w.eosed
    w.sub.close()
  }],
  ['two ids, one stored: the other still arrives live', async () => {
    const a = note('stored one')
    const b = note('later one')
    await relay.publish(a)
    const w = watch(relay, [{ ids: [a.id, b.id] }])
    await w.seen(a.id)
    await w.eosed
    await relay.publish(b)
    await w.seen(b.id)
    w.sub.close()
  }],
]

await runChecks('ids client', checks, () => relay.close())
