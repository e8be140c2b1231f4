// A NIP-29 client built on nostr-tools' nip29 helpers, driving a relay
// over a real WebSocket: create a closed channel, read it back with
// loadGroup, invite, join with and without a code, put and remove users,
// `previous` tags, delete-event, leave. Every step checks what the relay
// answered; the first wrong answer ends the script with exit status 1.
//
//   node nip29.mjs ws://127.0.0.1:PORT/
//
// The relay must serve the community of the URL's host and require no
// set-up beyond its defaults.

import assert from 'node:assert/strict'
import WebSocket from 'ws'
import { finalizeEvent, generateSecretKey, getPublicKey } from 'nostr-tools/pure'
import { Relay, useWebSocketImplementation } from 'nostr-tools/relay'
import { SimplePool, useWebSocketImplementation as usePoolWebSocket } from 'nostr-tools/pool'
import { fetchRelayInformation } from 'nostr-tools/nip11'
import * as nip29 from 'nostr-tools/nip29'
import { runChecks } from './checks.mjs'

useWebSocketImplementation(WebSocket)
usePoolWebSocket(WebSocket)

const url = process.argv[2]
assert.ok(url && url.startsWith('ws'), 'usage: node nip29.mjs ws://host:port/')
const GROUP = 'club'
const reference = { host: new URL(url).host, id: GROUP }

/** A user: a key, and a connection that answers the relay's NIP-42 challenge. */
async function user(name) {
  const sk = generateSecretKey()
  const relay = await Relay.connect(url)
  const sign = async template => finalizeEvent(template, sk)
  // The relay sends its challenge on connect; wait for it, then answer.
  for (let i = 0; i < 50 && !relay.challenge; i++) await new Promise(r => setTimeout(r, 20))
  await relay.auth(sign)
  return { name, sk, pubkey: getPublicKey(sk), relay }
}

/** Publishes `template` signed by `who`; the relay's OK message. */
async function publish(who, template) {
  const event = finalizeEvent(template, who.sk)
  try {
    return { ok: true, message: await who.relay.publish(event), event }
  } catch (err) {
    return { ok: false, message: String(err.message ?? err), event }
  }
}

async function accepted(who, template, what) {
  const r = await publish(who, template)
  assert.ok(r.ok, `${what}: ${r.message}`)
  return r.event
}

async function refused(who, template, prefix, what) {
  const r = await publish(who, template)
  assert.ok(!r.ok, `${what}: accepted, should be refused`)
  assert.ok(r.message.startsWith(prefix), `${what}: ${r.message} (wanted ${prefix})`)
  return r.message
}

function chat(content, extra = []) {
  return { kind: 9, content, created_at: Math.floor(Date.now() / 1000), tags: [['h', GROUP], ...extra] }
}

const pool = new SimplePool()
const info = await fetchRelayInformation(url)
assert.ok(info.supported_nips.includes(29), 'NIP-11 lists 29')
const opts = { pool, groupReference: reference, normalizedRelayURL: url, relayInformation: info }
const checks = []
const check = (name, fn) => checks.push([name, fn])

const admin = await user('admin')
const alice = await user('alice')
const bob = await user('bob')

check('create a closed channel and load it back', async () => {
  await accepted(admin, nip29.generateCreateGroupEventTemplate(GROUP, 'for the club'), 'create-group')
  const group = {
    relay: url,
    reference,
    metadata: { id: GROUP, pubkey: info.pubkey, name: 'The club', about: 'members only', isClosed: true },
  }
  await accepted(admin, nip29.generateEditGroupMetadataEventTemplate(group), 'edit-metadata')
  const loaded = await nip29.loadGroup(opts)
  assert.equal(loaded.metadata.id, GROUP)
  assert.equal(loaded.metadata.pubkey, info.pubkey, '39000 signed by the NIP-11 pubkey')
  assert.equal(loaded.metadata.name, 'The club')
  assert.equal(loaded.metadata.about, 'members only')
  assert.equal(loaded.metadata.isClosed, true)
  assert.notEqual(loaded.metadata.isPrivate, true)
  assert.deepEqual(loaded.admins.map(a => a.pubkey), [admin.pubkey])
  assert.deepEqual(loaded.members.map(m => m.pubkey), [admin.pubkey])
  const roles = nip29.parseGroupRolesEvent(await nip29.fetchGroupRolesEvent(opts))
  assert.deepEqual(roles.map(r => r.name).sort(), ['admin', 'member'])
})

check('only admins create invites; a code lets a join in at once', async () => {
  await refused(alice, nip29.generateCreateInviteEventTemplate(GROUP, 'sesame'), 'restricted:', 'invite by a stranger')
  await accepted(admin, nip29.generateCreateInviteEventTemplate(GROUP, 'sesame'), 'create-invite')
  await accepted(alice, nip29.generateGroupJoinRequestEventTemplate(GROUP, 'sesame'), 'join with code')
  const members = nip29.parseGroupMembersEvent(await nip29.fetchGroupMembersEvent(opts))
  assert.ok(members.some(m => m.pubkey === alice.pubkey), 'alice is a member')
})

check('a join without a code waits; put-user lets it in', async () => {
  await accepted(bob, nip29.generateGroupJoinRequestEventTemplate(GROUP, 'guess'), 'join with a wrong code')
  let members = nip29.parseGroupMembersEvent(await nip29.fetchGroupMembersEvent(opts))
  assert.ok(!members.some(m => m.pubkey === bob.pubkey), 'bob waits')
  await refused(bob, chat('let me in'), 'restricted:', 'a non-member posts')
  await refused(alice, nip29.generatePutUserEventTemplate(GROUP, bob.pubkey), 'restricted:', 'put-user by a member')
  await accepted(admin, nip29.generatePutUserEventTemplate(GROUP, bob.pubkey, ['member']), 'put-user')
  members = nip29.parseGroupMembersEvent(await nip29.fetchGroupMembersEvent(opts))
  assert.ok(members.some(m => m.pubkey === bob.pubkey), 'bob is a member')
  await accepted(bob, chat('hello'), 'a member posts')
})

check('previous names recent events of the channel', async () => {
  const first = await accepted(alice, chat('first'), 'first')
  const second = await accepted(bob, chat('second'), 'second')
  await accepted(alice, chat('third', [['previous', first.id.slice(0, 8), second.id.slice(0, 8)]]), 'previous')
  await refused(alice, chat('fork', [['previous', 'deadbeef']]), 'invalid:', 'an unknown previous')
})

check('admins delete events, members may not', async () => {
  const doomed = await accepted(bob, chat('delete me'), 'doomed')
  await refused(alice, nip29.generateDeleteEventEventTemplate(GROUP, doomed.id), 'restricted:', 'delete by a member')
  assert.equal((await pool.querySync([url], { ids: [doomed.id] })).length, 1)
  await accepted(admin, nip29.generateDeleteEventEventTemplate(GROUP, doomed.id, 'spam'), 'delete-event')
  assert.equal((await pool.querySync([url], { ids: [doomed.id] })).length, 0, 'deleted event gone')
})

check('remove-user and leave keep the members list current', async () => {
  await accepted(admin, nip29.generateRemoveUserEventTemplate(GROUP, bob.pubkey, 'bye'), 'remove-user')
  await refused(bob, chat('still here?'), 'restricted:', 'a removed user posts')
  await accepted(alice, nip29.generateGroupLeaveRequestEventTemplate(GROUP, 'busy'), 'leave')
  const group = await nip29.loadGroup(opts)
  assert.deepEqual(group.members.map(m => m.pubkey), [admin.pubkey])
  for (const kind of [39000, 39001, 39002, 39003]) {
    const events = await pool.querySync([url], { kinds: [kind], '#d': [GROUP] })
    assert.equal(events.length, 1, `one current ${kind}`)
    assert.equal(events[0].pubkey, info.pubkey, `${kind} is relay-signed`)
  }
})

await runChecks('nip29 client', checks, () => {
  for (const u of [admin, alice, bob]) u.relay.close()
  pool.destroy()
})
