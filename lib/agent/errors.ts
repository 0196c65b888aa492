// Turns the agent's ERR / GOAWAY payloads into TorporError subclasses with the agent's code.
import { constants } from 'node:os';

import { createError, type TorporError } from '../errors.js';
import type { Fields } from './fields.js';

const errnoByName = constants.errno as Record<string, number>;

/** The codes the agent may send (docs/protocol.md); anything else is reported as REQUEST_FAILED
 *  so a hostile or newer agent cannot make us throw codes outside our contract. */
const AGENT_CODES = new Set([
  'FILE_NOT_FOUND',
  'PERMISSION_DENIED',
  'FILE_EXISTS',
  'NOT_A_DIRECTORY',
  'IS_A_DIRECTORY',
  'NOT_EMPTY',
  'OUT_OF_SPACE',
  'INVALID_ARGUMENT',
  'PROCESS_NOT_FOUND',
  'OUTPUT_LOST',
  'PROTOCOL_ERROR',
  'REQUEST_FAILED',
  'TIMEOUT',
]);

export function agentError(fields: Fields, what: string): TorporError {
  const rawCode = fields.str('code') ?? 'REQUEST_FAILED';
  const code = AGENT_CODES.has(rawCode) ? rawCode : 'REQUEST_FAILED';
  const errnoName = fields.str('errno');
  const detail = fields.str('message') ?? rawCode;
  const message = `${what}: ${detail}${errnoName && !detail.includes(errnoName) ? ` (${errnoName})` : ''}`;
  const errno = errnoName ? errnoByName[errnoName] : undefined;
  return createError(code, message, errno);
}
