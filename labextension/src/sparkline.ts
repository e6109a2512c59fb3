/** A small SVG sparkline of a job's recent throughput or utilization. */

import { sparklinePoints } from './format';

const SVG = 'http://www.w3.org/2000/svg';
export const SPARK_WIDTH = 48;
export const SPARK_HEIGHT = 14;

/** An `<svg>` with one polyline, or null with fewer than two values. */
export function sparkline(
  values: Array<number | null>,
  title: string
): SVGSVGElement | null {
  const points = sparklinePoints(values, SPARK_WIDTH, SPARK_HEIGHT);
  if (!points) {
    return null;
  }
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('class', 'jp-tf-spark');
  svg.setAttribute('width', String(SPARK_WIDTH));
  svg.setAttribute('height', String(SPARK_HEIGHT));
  svg.setAttribute('viewBox', `0 0 ${SPARK_WIDTH} ${SPARK_HEIGHT}`);
  const label = document.createElementNS(SVG, 'title');
  label.textContent = title;
  const line = document.createElementNS(SVG, 'polyline');
  line.setAttribute('points', points);
  svg.append(label, line);
  return svg;
}
