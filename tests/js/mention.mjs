// A person using nostr-tools, and nothing of this relay's own, asks a
// managed agent in a channel: joins the (open) channel, sends a kind 9
// that p-tags the agent, and sees the agent's reply threaded under it;
// a second mention, over the agent's cap for one sender, is answered by
// the relay's notice, a plain kind 9 threaded the same way. The agent,
// its owner's setting and the cap are set up by the test that runs this.
//
//   node mention.mjs ws://127.0.0.1:PORT/ <channel> <agent hex> <relay hex>

import assert from 'node:assert/strict'
import WebSocket from 'ws'
import { finalizeEvent, generateSecretKey, getPublicKey } from 'nostr-tools/pure'
import { Relay, useWebSocketImplementation } from 'nostr-tools/relay'
import { runChecks } from './checks.mjs'

useWebSocketImplementation(WebSocket)

const [url, channel, agent, relayKey] = process.argv.slice(2)
assert.ok(url && channel && agent && relayKey, 'usage: node mention.mjs <ws url> <channel> <agent hex> <relay hex>')

const sk = generateSecretKey()
const relay = await Relay.connect(url)
for (let i = 0; i < 50 && !relay.challenge; i++) await new Promise(r => setTimeout(r, 20))
await relay.auth(async t => finalizeEvent(t, sk))

const now = () => Math.floor(Date.now() / 1000)
const send = template => {
  const event = finalizeEvent({ created_at: now(), ...template }, sk)
  return relay.publish(event).then(() => event)
}

/** The first kind 9 by `author` that replies to `id` (NIP-10 `e`), within 30 s. */
function answerTo(id, author) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => { sub.close(); reject(new Error(`no answer to ${id} by ${author}`)) }, 30_000)
    const sub = relay.subscribe([{ kinds: [9], '#h': [channel], '#e': [id], authors: [author] }], {
      onevent(e) { clearTimeout(timer); sub.close(); resolve(e) },
    })
  })
}

const threadedUnder = (e, id) => e.tags.some(t => t[0] === 'e' && t[1] === id && t[3] === 'root')

const checks = []
const check = (name, fn) => checks.push([name, fn])

check('join the channel', async () => {
  await send({ kind: 9021, content: '', tags: [['h', channel]] })
})

check('mention the agent; its reply comes threaded under the mention', async () => {
  const asked = await send({ kind: 9, content: 'can you check the build?', tags: [['h', channel], ['p', agent]] })
  const reply = await answerTo(asked.id, agent)
  assert.ok(threadedUnder(reply, asked.id), `reply tags: ${JSON.stringify(reply.tags)}`)
  assert.ok(reply.content.includes('can you check the build?'), reply.content)
})

check('over the cap, the relay says so in the channel', async () => {
  const more = await send({ kind: 9, content: 'and the docs?', tags: [['h', channel], ['p', agent]] })
  const notice = await answerTo(more.id, relayKey)
  assert.ok(threadedUnder(notice, more.id), `notice tags: ${JSON.stringify(notice.tags)}`)
  assert.ok(notice.tags.some(t => t[0] === 'p' && t[1] === getPublicKey(sk)), 'the notice names the sender')
  assert.ok(notice.content.includes('not passed on'), notice.content)
})

await runChecks('mention client', checks, () => relay.close())
