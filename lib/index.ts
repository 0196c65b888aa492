// torpor's public entry point.
export * from './errors.js';
