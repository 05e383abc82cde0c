import { createContext, useContext } from 'react';
import type { StreamState } from './stream';

export const LiveContext = createContext<StreamState>('connecting');
export const useLiveState = () => useContext(LiveContext);
