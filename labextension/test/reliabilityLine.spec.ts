import { reliabilityTooltip } from '../src/reliabilityLine';
import { IReliability } from '../src/types';

describe('the reliability tooltip', () => {
  it('names planned stops and drills apart from the rate', () => {
    const summary: IReliability = {
      since_text: '30d',
      since: null,
      until: 0,
      jobs: 2,
      units: [
        {
          unit: 'vCPU',
          exposure_days: 0.0125,
          infrastructure_failures: 0,
          user_errors: 0,
          drills: 1,
          stops: 2,
          rate: 'too little exposure for a rate',
          mttr_p50_s: null,
          ettr: 0.5
        }
      ],
      lemons: [],
      text: '2 jobs · vCPU: ETTR 50 %, 0 infra failures, 1 drill (not counted)'
    };
    expect(reliabilityTooltip(summary)).toBe(
      '2 jobs started in the period\n' +
        'vCPU: too little exposure for a rate; exposure 0.0125 vCPU-days,' +
        ' 2 planned stops, 1 drill (injected: not in the rate)'
    );
  });
});
