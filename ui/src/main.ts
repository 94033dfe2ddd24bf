/** Entry point: mounts the dashboard into the page. */
import './lib/locale-guard';
import { mount } from 'svelte';
import './app.css';
import App from './App.svelte';

const target = document.getElementById('app');
if (target === null) throw new Error('index.html has no #app element');

export default mount(App, { target });
